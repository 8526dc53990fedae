//! Where in the text a field is, and which field a place in the text belongs to: errors from
//! the TOML parser come with a byte span, those of the model with a field path, and every
//! refusal names both (`spillway.toml:14:10: vips[2].backends[0].weight: ...`).

use std::{fmt, ops::Range};

use toml::{
    Spanned,
    de::{DeTable, DeValue},
};

/// A field path: `vips[2].backends[0].weight`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath(Vec<Segment>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

impl FieldPath {
    pub fn key(mut self, key: &str) -> Self {
        self.0.push(Segment::Key(key.to_owned()));
        self
    }

    pub fn index(mut self, index: usize) -> Self {
        self.0.push(Segment::Index(index));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Appends a dotted sub-path (`health.policy.fall`).
    pub fn keys(self, dotted: &str) -> Self {
        dotted.split('.').filter(|k| !k.is_empty()).fold(self, |path, key| path.key(key))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) if i == 0 => write!(f, "{key}")?,
                Segment::Key(key) => write!(f, ".{key}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// The span of the deepest part of `path` the document has: the value of the last key, or
/// the table that should have held a missing field.
pub fn span_of(root: &Spanned<DeTable<'_>>, path: &FieldPath) -> Range<usize> {
    let mut span = root.span();
    let mut value: Option<&DeValue<'_>> = None;
    let mut table = Some(root.get_ref());
    for segment in &path.0 {
        let next = match (segment, table, value) {
            (Segment::Key(key), Some(t), _) => t.get(key.as_str()),
            (Segment::Index(i), _, Some(DeValue::Array(items))) => items.get(*i),
            _ => None,
        };
        let Some(next) = next else { break };
        span = next.span();
        value = Some(next.get_ref());
        table = next.get_ref().as_table();
    }
    span
}

/// The path of the field whose key or value holds byte `offset`.
pub fn path_at(root: &Spanned<DeTable<'_>>, offset: usize) -> FieldPath {
    fn in_table(table: &DeTable<'_>, offset: usize, path: &FieldPath) -> Option<FieldPath> {
        table.iter().find_map(|(key, value)| {
            let path = path.clone().key(key.get_ref());
            if key.span().contains(&offset) {
                return Some(path);
            }
            in_value(value, offset, &path)
        })
    }
    fn in_value(value: &Spanned<DeValue<'_>>, offset: usize, path: &FieldPath) -> Option<FieldPath> {
        // A table's span may be only its `[header]`: its fields are searched whatever it says.
        let inner = match value.get_ref() {
            DeValue::Table(table) => in_table(table, offset, path),
            DeValue::Array(items) => items.iter().enumerate().find_map(|(i, item)| in_value(item, offset, &path.clone().index(i))),
            _ => None,
        };
        inner.or_else(|| value.span().contains(&offset).then(|| path.clone()))
    }
    in_table(root.get_ref(), offset, &FieldPath::default()).unwrap_or_default()
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}
