//! Facts about processes from `/proc/PID/stat`, parsed in one place for the agent (its
//! runtimes and supervision, exec sessions' process groups, the replica port check) and the
//! embodied runtime (its access rules and safety watchdog). `rlark-observe`'s process
//! metrics read the CPU and memory fields of `/proc/self/stat` themselves.
//!
//! A process is told from a later one given the same PID by its start time (field 22,
//! clock ticks after boot): a `(pid, start_ticks)` pair names one process for good.

use std::io;

/// The fields of `/proc/PID/stat` rlark reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: the state letter (`R`, `S`, `D`, `Z`, `X`, ...).
    pub state: char,
    /// Field 4: the parent's PID (0 when it is outside this PID namespace).
    pub ppid: i32,
    /// Field 5: the process group.
    pub pgrp: i32,
    /// Field 6: the session ID, the PID of the session leader (0 when the leader is outside
    /// this PID namespace).
    pub session: i32,
    /// Field 22: the start time in clock ticks after boot; with the PID, it identifies the
    /// process across PID reuse.
    pub start_ticks: u64,
}

impl ProcStat {
    /// A zombie or a dead process (`Z`, `X`, or `x` of older kernels): it has exited.
    pub fn is_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// The fields of the text of `/proc/PID/stat`. The command name (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`. `None` when the text is not
/// such a line.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (the state), so field N is fields[N - 3].
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
}

/// `/proc/PID/stat` of process `pid`, whatever its state (zombies too). A process that is
/// not there is `NotFound`; a line that cannot be parsed is `InvalidData`.
pub fn read_stat(pid: i32) -> io::Result<ProcStat> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path)?;
    parse_stat(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("cannot parse {path}")))
}

/// `/proc/PID/stat` of a live process (`None`: gone, a zombie, or unreadable).
pub fn live_stat(pid: i32) -> Option<ProcStat> {
    read_stat(pid).ok().filter(|stat| !stat.is_exited())
}

/// The start ticks of process `pid` now, if it lives.
pub fn start_ticks(pid: i32) -> Option<u64> {
    live_stat(pid).map(|s| s.start_ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let text = "4242 (a) b (c)) S 7 4242 99 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2";
        assert_eq!(
            parse_stat(text),
            Some(ProcStat {
                state: 'S',
                ppid: 7,
                pgrp: 4242,
                session: 99,
                start_ticks: 987654
            })
        );
        let zombie = parse_stat(&text.replace(" S ", " Z ")).expect("a zombie parses");
        assert!(zombie.is_exited(), "a zombie");
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn parses_proc_stat_with_odd_command_names() {
        let text = "1234 (my (odd) cmd) S 1 1230 1200 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(
            parse_stat(text),
            Some(ProcStat {
                state: 'S',
                ppid: 1,
                pgrp: 1230,
                session: 1200,
                start_ticks: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn stat_lines_parse_even_with_odd_command_names() {
        let line = "1234 (my (odd) prog) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let stat = parse_stat(line).expect("parse");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.pgrp, 1234);
        assert_eq!(stat.start_ticks, 987654);
    }

    #[test]
    fn this_process_lives_and_a_reaped_child_is_gone() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let stat = live_stat(me).expect("own stat");
        assert_eq!(start_ticks(me), Some(stat.start_ticks));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = i32::try_from(child.id()).expect("pid");
        child.wait().expect("wait");
        assert_eq!(
            read_stat(pid).map_err(|e| e.kind()),
            Err(io::ErrorKind::NotFound)
        );
        assert_eq!(live_stat(pid), None);
    }
}
