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

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let mut t = Table::new(&[("NAME", Align::Left), ("COUNT", Align::Right), ("NOTE", Align::Left)]);
        t.row(vec!["a".into(), "1".into(), "".into()]);
        t.row(vec!["longer".into(), "12345".into(), "x".into()]);
        assert_eq!(t.render(), "NAME    COUNT  NOTE\na           1\nlonger  12345  x\n");
    }
}
