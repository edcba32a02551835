//! Shared output: durations for people and for JSON, tables, and JSON lines.

use std::time::Duration;

use serde::Serialize;

/// A duration for people: `850ms`, `27.4s`, `3m12s`, `2h05m`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", d.as_secs_f64()),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, (ms / 1_000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

/// A ttl for people: `none` for a key without expiry.
pub fn ttl(d: Option<Duration>) -> String {
    d.map_or_else(|| "no expiry".to_owned(), human)
}

/// A duration in whole milliseconds, for JSON.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Prints `value` as one JSON line on stdout.
pub fn json_line(value: &impl Serialize) {
    match serde_json::to_string(value) {
        Ok(line) => println!("{line}"),
        // Only maps with non-string keys fail, which the CLI never builds.
        Err(e) => eprintln!("redlock: cannot write JSON: {e}"),
    }
}

/// Rows padded to columns (the last column is not padded).
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[c] - cell.chars().count();
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_durations_read_well() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(27_449)), "27.4s");
        assert_eq!(human(Duration::from_secs(192)), "3m12s");
        assert_eq!(human(Duration::from_secs(7_500)), "2h05m");
        assert_eq!(ttl(None), "no expiry");
    }

    #[test]
    fn inspect_tables_pad_all_but_the_last_column() {
        let rows = vec![
            vec!["a".to_owned(), "bb".to_owned(), "c".to_owned()],
            vec!["aaa".to_owned(), "b".to_owned(), "c".to_owned()],
        ];
        assert_eq!(table(&rows), "a    bb  c\naaa  b   c\n");
    }
}
