use super::process::*;
use super::target::*;
use super::*;
use nix::unistd::Pid;

#[test]
fn environ_is_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("environ");
    std::fs::write(&path, b"A=1\0B=x=y\0EMPTY=\0=bad\0noequals\0\0").unwrap();
    let env = read_environ(&path).unwrap();
    let pairs: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "x=y".to_string()),
            ("EMPTY".to_string(), String::new()),
        ]
    );
}

#[test]
fn our_own_process_reads_back() {
    let target = read_environ(Path::new("/proc/self/environ")).unwrap();
    assert!(target.iter().any(|(k, _)| k == "PATH"), "{target:?}");
    let me = i32::try_from(std::process::id()).unwrap();
    let group = nix::unistd::getpgrp().as_raw();
    assert!(members(group, false).contains(&Pid::from_raw(me)));
    assert!(!members(me + 1_000_000, true).contains(&Pid::from_raw(me)));
}
