//! Aligned text tables for `lbctl`'s default output.

#[derive(Clone, Copy)]
pub enum Align {
    Left,
    /// Numbers line up on their last digit.
    Right,
}

pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Self { columns: columns.to_vec(), rows: Vec::new() }
    }

    /// Adds a row; every cell is made [`printable`] (cells carry text from outside: process
    /// names, probe answers, reports of agents).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.into_iter().map(|c| printable(&c).into_owned()).collect());
    }

    pub fn render(&self) -> String {
        let headers: Vec<String> = self.columns.iter().map(|(h, _)| h.to_string()).collect();
        let lines: Vec<&Vec<String>> = std::iter::once(&headers).chain(&self.rows).collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| lines.iter().filter_map(|cells| cells.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for cells in lines {
            let padded: Vec<String> = self
                .columns
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, ((_, align), &width))| {
                    let cell = cells.get(i).map_or("", String::as_str);
                    match align {
                        Align::Left => format!("{cell:<width$}"),
                        Align::Right => format!("{cell:>width$}"),
                    }
                })
                .collect();
            out.push_str(padded.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` with every control character (C0, DEL, C1: what a terminal may act on, such as
/// the ESC that starts an escape sequence) written as a visible escape, `\x1b` or `\u{9b}`.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if c.is_control() && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_from_outside_cannot_reach_the_terminal_as_controls() {
        assert_eq!(printable("leaky-svc"), "leaky-svc");
        assert_eq!(printable("\x1b[31mleaky-svc\x07"), "\\x1b[31mleaky-svc\\x07");
        assert_eq!(printable("a\nb\tc\u{9b}2J\u{7f}"), "a\\x0ab\\x09c\\u{9b}2J\\x7f");
        assert_eq!(printable("naïve ✓"), "naïve ✓", "printable text is kept as it is");
        let mut t = Table::new(&[("COMM", Align::Left)]);
        t.row(vec!["\x1b]0;owned\x07x".into()]);
        let rendered = t.render();
        assert!(!rendered.chars().any(|c| c.is_control() && c != '\n'), "{rendered:?}");
        assert!(rendered.contains("\\x1b]0;owned\\x07x"), "{rendered}");
    }

    #[test]
    fn columns_line_up() {
        let mut t = Table::new(&[("NAME", Align::Left), ("COUNT", Align::Right), ("NOTE", Align::Left)]);
        t.row(vec!["a".into(), "1".into(), "".into()]);
        t.row(vec!["longer".into(), "12345".into(), "x".into()]);
        assert_eq!(t.render(), "NAME    COUNT  NOTE\na           1\nlonger  12345  x\n");
    }
}
