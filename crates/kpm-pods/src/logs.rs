//! The last lines of a container run's log, in the CRI log format the
//! runtime writes for the kubelet: `TIME STREAM TAG MESSAGE`, one line per
//! record, `TAG` `P` for a part of a long line and `F` for its end
//! (`2026-11-28T14:03:27.123456789Z stderr F message`).

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// One line a container printed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogLine {
    /// When the runtime read it (RFC 3339, as written).
    pub time: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// What was printed, its parts joined.
    pub text: String,
}

/// The lines of the log at `path` (where this process reads it) within its
/// last `max_bytes`, oldest first; a record cut by the bound, or not in the
/// format, is left out.
pub fn log_tail(path: &Path, max_bytes: u64) -> io::Result<Vec<LogLine>> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    // Read from the middle of the file, the first record is cut.
    let records = text.lines().skip(usize::from(start > 0));
    Ok(joined(records))
}

/// Records, their partial lines (`P`) joined to the line they end in (`F`).
fn joined<'a>(records: impl Iterator<Item = &'a str>) -> Vec<LogLine> {
    let mut lines = Vec::new();
    let mut partial: Option<LogLine> = None;
    for record in records {
        let mut fields = record.splitn(4, ' ');
        let (Some(time), Some(stream), Some(tag)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !matches!(stream, "stdout" | "stderr") || !(tag.starts_with('P') || tag.starts_with('F'))
        {
            continue;
        }
        let message = fields.next().unwrap_or_default();
        let line = partial.get_or_insert_with(|| LogLine {
            time: time.to_owned(),
            stream: stream.to_owned(),
            text: String::new(),
        });
        line.text.push_str(message);
        // A tag is `P` or `F`, optionally followed by `:` and more flags.
        if !tag.starts_with('P') {
            lines.extend(partial.take());
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    #[test]
    fn records_are_read_with_their_parts_joined() {
        let log = "2026-11-28T10:00:00.000000001Z stderr F I1128 started\n\
                   2026-11-28T10:00:01.000000001Z stderr P first half \n\
                   2026-11-28T10:00:01.000000002Z stderr F second half\n\
                   not a record\n\
                   2026-11-28T10:00:02.000000001Z stdout F \n";
        let lines = joined(log.lines());
        let texts: Vec<&str> = lines.iter().map(|line| line.text.as_str()).collect();
        assert_eq!(texts, ["I1128 started", "first half second half", ""]);
        assert_eq!(lines[1].time, "2026-11-28T10:00:01.000000001Z");
        assert_eq!(lines[2].stream, "stdout");
    }

    #[test]
    fn the_tail_leaves_out_the_record_the_bound_cuts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("3.log");
        let mut file = std::fs::File::create(&path).unwrap();
        for n in 0..100 {
            writeln!(file, "2026-11-28T10:00:00.000000001Z stderr F line {n}").unwrap();
        }
        let all = log_tail(&path, 1 << 20).unwrap();
        assert_eq!(all.len(), 100);
        let tail = log_tail(&path, 100).unwrap();
        assert!(!tail.is_empty() && tail.len() < 3, "{tail:?}");
        assert_eq!(tail.last().unwrap().text, "line 99");
        assert!(log_tail(&dir.path().join("none.log"), 100).is_err());
    }
}
