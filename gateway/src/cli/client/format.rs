//! Ollama's ways of printing sizes, times and tables (its `format` package
//! and the tablewriter settings of `ollama list`/`ps`), so that hypura's
//! output reads as `ollama`'s does.
use chrono::{DateTime, Utc};

/// Decimal units as Ollama's `format.HumanBytes`: `98 MB`, `4.7 GB`, `512 B`
/// (whole above 10, one decimal below unless whole).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
        (1_000, "KB"),
    ];
    let Some(&(scale, unit)) = UNITS.iter().find(|(scale, _)| bytes >= *scale) else {
        return format!("{bytes} B");
    };
    let value = bytes as f64 / scale as f64;
    if value >= 10.0 || value == value.trunc() {
        format!("{} {unit}", value as u64)
    } else {
        format!("{value:.1} {unit}")
    }
}

/// Ollama's `format.HumanTime` of `time` seen at `now`: `2 days ago`,
/// `4 minutes from now`, `Forever` (more than 20 years ahead).
pub fn human_time(time: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let delta = now.signed_duration_since(time);
    if delta.num_days() / 365 < -20 {
        "Forever".to_string()
    } else if delta < chrono::TimeDelta::zero() {
        format!("{} from now", human_duration(-delta))
    } else {
        format!("{} ago", human_duration(delta))
    }
}

/// An RFC 3339 time as [`human_time`] prints it; the text itself if unparsable.
pub fn human_time_text(text: &str, now: DateTime<Utc>) -> String {
    DateTime::parse_from_rfc3339(text)
        .map(|t| human_time(t.with_timezone(&Utc), now))
        .unwrap_or_else(|_| text.to_string())
}

fn human_duration(d: chrono::TimeDelta) -> String {
    let seconds = d.num_seconds();
    match seconds {
        ..1 => return "Less than a second".into(),
        1 => return "1 second".into(),
        2..60 => return format!("{seconds} seconds"),
        _ => {}
    }
    let minutes = d.num_minutes();
    match minutes {
        1 => return "About a minute".into(),
        2..60 => return format!("{minutes} minutes"),
        _ => {}
    }
    let hours = (d.num_milliseconds() as f64 / 3_600_000.0).round() as i64;
    match hours {
        ..=1 => "About an hour".into(),
        2..48 => format!("{hours} hours"),
        48..336 => format!("{} days", hours / 24),
        336..1440 => format!("{} weeks", hours / 24 / 7),
        1440..17520 => format!("{} months", hours / 24 / 30),
        _ => format!("{} years", d.num_days() / 365),
    }
}

/// Ollama's PROCESSOR column: `100% GPU`, `100% CPU`, `48%/52% CPU/GPU`.
pub fn processor(size: u64, size_vram: u64) -> String {
    if size_vram == 0 {
        "100% CPU".into()
    } else if size_vram == size {
        "100% GPU".into()
    } else if size_vram > size || size == 0 {
        "Unknown".into()
    } else {
        let cpu = ((size - size_vram) as f64 / size as f64 * 100.0).round() as u64;
        format!("{cpu}%/{}% CPU/GPU", 100 - cpu)
    }
}

/// The first 12 hex digits of a digest (`sha256:` prefix dropped), Ollama's ID.
pub fn short_id(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.chars().take(12).collect()
}

/// A table as `ollama list` prints one: a header, left-aligned columns each
/// as wide as its widest cell, four spaces between, no trailing spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 4));
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
    fn bytes_read_as_ollama_prints_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_000), "1 KB");
        assert_eq!(human_bytes(1_500), "1.5 KB");
        assert_eq!(human_bytes(98_362_432), "98 MB");
        assert_eq!(human_bytes(4_661_224_676), "4.7 GB");
        assert_eq!(human_bytes(26_300_000_000), "26 GB");
        assert_eq!(human_bytes(2_000_000_000_000), "2 TB");
    }

    #[test]
    fn times_read_as_ollama_prints_them() {
        let now = DateTime::parse_from_rfc3339("2026-12-01T05:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: i64| now + chrono::TimeDelta::seconds(s);
        assert_eq!(human_time(at(0), now), "Less than a second ago");
        assert_eq!(human_time(at(-1), now), "1 second ago");
        assert_eq!(human_time(at(-59), now), "59 seconds ago");
        assert_eq!(human_time(at(-90), now), "About a minute ago");
        assert_eq!(human_time(at(299), now), "4 minutes from now");
        assert_eq!(human_time(at(-3600), now), "About an hour ago");
        assert_eq!(human_time(at(-5 * 3600), now), "5 hours ago");
        assert_eq!(human_time(at(-3 * 86400), now), "3 days ago");
        assert_eq!(human_time(at(-21 * 86400), now), "3 weeks ago");
        assert_eq!(human_time(at(-90 * 86400), now), "3 months ago");
        assert_eq!(human_time(at(-800 * 86400), now), "2 years ago");
        assert_eq!(human_time_text("2286-11-20T17:46:40Z", now), "Forever");
    }

    #[test]
    fn processor_shares() {
        assert_eq!(processor(100, 0), "100% CPU");
        assert_eq!(processor(100, 100), "100% GPU");
        assert_eq!(processor(100, 52), "48%/52% CPU/GPU");
        assert_eq!(processor(0, 5), "Unknown");
    }

    #[test]
    fn tables_pad_columns_by_four_spaces() {
        let rows = vec![
            vec!["a:latest".to_string(), "1 MB".to_string()],
            vec!["longer:latest".to_string(), "98 MB".to_string()],
        ];
        assert_eq!(
            table(&["NAME", "SIZE"], &rows),
            "NAME             SIZE\na:latest         1 MB\nlonger:latest    98 MB\n"
        );
        assert_eq!(short_id("sha256:0123456789abcdef"), "0123456789ab");
    }
}
