//! Columns aligned for a terminal, as kubectl prints them: upper-case headers, three spaces
//! between columns, no borders.

/// `rows` under `headers`, each column as wide as its widest cell.
pub fn draw(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(cell, &width)| format!("{cell:<width$}"))
            .collect();
        padded.join("   ").trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let rows = vec![
            vec!["cpu".to_owned(), "2".to_owned(), "16".to_owned()],
            vec!["memory".to_owned(), "4Gi".to_owned(), "-".to_owned()],
        ];
        assert_eq!(
            draw(&["RESOURCE", "USED", "LIMIT"], &rows),
            "RESOURCE   USED   LIMIT\ncpu        2      16\nmemory     4Gi    -\n"
        );
    }
}
