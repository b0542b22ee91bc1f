//! What `/proc` says about a process: CPU time, resident memory, open file
//! descriptors and threads.
//!
//! CPU time comes two ways: `utime + stime` of `/proc/PID/stat` in clock
//! ticks (including threads that have exited; 10 ms resolution at the usual
//! 100 Hz), and the sum of the first field of every live thread's
//! `/proc/PID/task/TID/schedstat` (nanoseconds on a CPU), which resolves the
//! small figures of an idle process.

use std::fs;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Result;
use crate::stats::{float, round};

/// One reading of a process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) at: Instant,
    /// `utime + stime`, in clock ticks.
    pub(crate) ticks: u64,
    /// Time on a CPU of the live threads, from schedstat.
    pub(crate) sched_ns: u64,
    pub(crate) rss_kb: u64,
    /// Of the RSS, anonymous pages (the heap, stacks: `RssAnon`) and pages
    /// of mapped files (the binary's code and data: `RssFile`).
    pub(crate) rss_anon_kb: u64,
    pub(crate) rss_file_kb: u64,
    /// Peak RSS (`VmHWM`).
    pub(crate) hwm_kb: u64,
    pub(crate) fds: u64,
    pub(crate) threads: u64,
}

/// Reads `/proc/<pid>` (`"self"` for this process).
pub(crate) fn sample(pid: &str) -> Result<Sample> {
    let at = Instant::now();
    let dir = format!("/proc/{pid}");
    let stat = fs::read_to_string(format!("{dir}/stat"))?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // Field 3 (state) is fields[0]: utime is field 14, stime 15, num_threads 20.
    let field = |n: usize| -> Result<u64> {
        let text = fields.get(n - 3).ok_or_else(|| format!("{dir}/stat: no field {n}"))?;
        Ok(text.parse()?)
    };
    let ticks = field(14)? + field(15)?;
    let threads = field(20)?;
    let status = fs::read_to_string(format!("{dir}/status"))?;
    let kb = |key: &str| -> Result<u64> {
        let line = status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .ok_or_else(|| format!("{dir}/status: no {key}"))?;
        Ok(line.trim().trim_end_matches("kB").trim().parse()?)
    };
    let rss_kb = kb("VmRSS:")?;
    let hwm_kb = kb("VmHWM:")?;
    let (rss_anon_kb, rss_file_kb) = (kb("RssAnon:")?, kb("RssFile:")?);
    let mut fds = 0;
    for entry in fs::read_dir(format!("{dir}/fd"))? {
        entry?;
        fds += 1;
    }
    let mut sched_ns = 0;
    for task in fs::read_dir(format!("{dir}/task"))? {
        // A thread may exit between the listing and the read.
        let Ok(text) = fs::read_to_string(task?.path().join("schedstat")) else { continue };
        sched_ns +=
            text.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(Sample { at, ticks, sched_ns, rss_kb, rss_anon_kb, rss_file_kb, hwm_kb, fds, threads })
}

/// Whether process `pid` is running: it exists and is neither a zombie
/// (exited, not yet reaped by its parent) nor dead.
pub(crate) fn alive(pid: &str) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
        state.is_some_and(|state| !matches!(state, "Z" | "X" | "x"))
    })
}

/// Clock ticks per second (`getconf CLK_TCK`), 100 if that cannot be run.
pub(crate) fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .filter(|&ticks| ticks > 0)
        .unwrap_or(100)
}

/// Megabytes (10^6 bytes) of `kb` kibibytes.
pub(crate) fn mb(kb: u64) -> f64 {
    round(float(kb) * 1024.0 / 1e6, 2)
}

/// `{"rss_mb", "peak_rss_mb", "fds", "threads"}` of one sample.
pub(crate) fn memory(sample: &Sample) -> Value {
    json!({
        "rss_mb": mb(sample.rss_kb),
        "peak_rss_mb": mb(sample.hwm_kb),
        "fds": sample.fds,
        "threads": sample.threads,
    })
}

/// CPU use between two samples, in percent of one core: `{"cpu_percent"}`
/// from clock ticks, `{"cpu_percent_schedstat"}` from the live threads'
/// schedstat, the raw ticks and the window.
pub(crate) fn cpu(start: &Sample, end: &Sample, ticks_per_second: u64) -> Value {
    let wall = end.at.duration_since(start.at);
    let ticks = end.ticks.saturating_sub(start.ticks);
    let by_ticks =
        Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / ticks_per_second.max(1));
    let by_sched = Duration::from_nanos(end.sched_ns.saturating_sub(start.sched_ns));
    let percent = |busy: Duration| round(100.0 * busy.as_secs_f64() / wall.as_secs_f64(), 4);
    json!({
        "window_s": round(wall.as_secs_f64(), 3),
        "cpu_ticks": ticks,
        "ticks_per_second": ticks_per_second,
        "cpu_percent": percent(by_ticks),
        "cpu_percent_schedstat": percent(by_sched),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let sample = sample("self").unwrap();
        assert!(sample.rss_kb > 0);
        assert!(sample.hwm_kb >= sample.rss_kb);
        assert!(sample.rss_anon_kb > 0 && sample.rss_file_kb > 0);
        assert!(sample.rss_anon_kb + sample.rss_file_kb <= sample.rss_kb);
        assert!(sample.fds >= 3);
        assert!(sample.threads >= 1);
        assert!(clock_ticks_per_second() > 0);
        assert!(alive("self"));
        assert!(!alive("0"));
    }

    #[test]
    fn cpu_is_percent_of_one_core() {
        let start = sample("self").unwrap();
        let end = Sample {
            at: start.at + Duration::from_secs(10),
            ticks: start.ticks + 100,
            sched_ns: start.sched_ns + 500_000_000,
            ..start
        };
        let value = cpu(&start, &end, 100);
        assert_eq!(value["cpu_percent"], 10.0);
        assert_eq!(value["cpu_percent_schedstat"], 5.0);
        assert!((mb(1000) - 1.02).abs() < 1e-9);
    }
}
