//! The node process's own numbers, read from /proc at scrape time: CPU
//! seconds, resident memory, open file descriptors and their limit, start
//! time. Linux only; elsewhere (or if /proc cannot be read) they are left
//! out rather than reported as zero.

/// What `/proc/self` says now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
    pub start_time_seconds: f64,
    pub threads: u64,
}

pub fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'. Then: state(3) ... utime(14) stime(15) ... threads(20)
    // ... starttime(22) vsize(23) rss(24), numbered from 1 as in proc(5).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |number: usize| -> Option<u64> { fields.get(number - 3)?.parse().ok() };
    let ticks = clock_ticks_per_second()?;
    let page_bytes = page_size()?;
    let boot_time = boot_time_seconds()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(ProcessStats {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        resident_bytes: field(24)? * page_bytes,
        virtual_bytes: field(23)?,
        open_fds,
        max_fds: max_open_files(),
        start_time_seconds: boot_time + field(22)? as f64 / ticks,
        threads: field(20)?,
    })
}

fn clock_ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

fn page_size() -> Option<u64> {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|size| *size > 0)
}

fn boot_time_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

fn max_open_files() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    // "Max open files            1024                 4096                 files"
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_memory_and_open_files() {
        let stats = super::read().expect("/proc is readable on Linux");
        assert!(stats.resident_bytes > 1 << 20, "{stats:?}");
        assert!(stats.open_fds >= 3, "{stats:?}");
        assert!(stats.threads >= 1, "{stats:?}");
        assert!(stats.start_time_seconds > 1.6e9, "{stats:?}");
    }
}
