//! The process's allocator, chosen per subcommand before the first allocation.
//!
//! The control plane (`server`, `up`, `controller-manager`) runs on mimalloc: under
//! 64 API clients glibc's malloc family was about a quarter of the server's CPU samples, and
//! mimalloc cut the CPU per create by ~30% (docs/benchmarks.md, "The allocator"). Everything
//! else — above all `agent` and `supervise`, which run on every host beside the workloads —
//! keeps glibc's allocator: under mimalloc the agent's RSS with 200 tasks grew from 52 to
//! 78 MiB in the same measurement. `bench` only starts the `rlark-bench` binary in this
//! process's place, and that binary runs on mimalloc throughout, as `rlark bench` did.
//!
//! The choice is made once, at the first allocation (before `main`), from `argv[1]` as read
//! from `/proc/self/cmdline`, and never changes, so every block is freed by the allocator
//! that made it. A subcommand given after global flags (`rlark --log-format json
//! server`) gets glibc's allocator: slower, equally correct.
//!
//! The command line is read with `std::fs::File` into a stack buffer (std passes short paths
//! to `open` through a stack buffer, so this does not allocate). Should anything allocate
//! while the choice is being made — that call, or another thread — it is served by glibc's
//! allocator and the choice becomes glibc's for good, so no block can reach the wrong
//! allocator.
//!
//! This is the one module of the project with `unsafe` code: implementing `GlobalAlloc` is
//! unsafe by definition; every call is forwarded unchanged to `System` or `MiMalloc`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;
/// The command line is being read.
const DECIDING: u8 = 3;

/// Subcommands that run on mimalloc.
const CONTROL_PLANE: [&[u8]; 3] = [b"server", b"up", b"controller-manager"];

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);
/// Something was allocated (by glibc's allocator) while the choice was being made.
static ALLOCATED_WHILE_DECIDING: AtomicBool = AtomicBool::new(false);

/// The `#[global_allocator]` of `rlark`.
pub struct ByCommand;

/// Which allocator `argv[1]` asks for (`args` is `/proc/self/cmdline`'s NUL-separated bytes).
fn choose(args: &[u8]) -> u8 {
    let subcommand = args.split(|&b| b == 0).nth(1).unwrap_or_default();
    if CONTROL_PLANE.contains(&subcommand) {
        MIMALLOC
    } else {
        SYSTEM
    }
}

/// Read the start of `/proc/self/cmdline` into `buffer`.
fn cmdline(buffer: &mut [u8]) -> &[u8] {
    use std::io::Read as _;
    let Ok(mut file) = std::fs::File::open("/proc/self/cmdline") else {
        return &[];
    };
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) | Err(_) => break,
            Ok(read) => filled += read,
        }
    }
    &buffer[..filled]
}

fn choice() -> u8 {
    match CHOICE.load(Ordering::Acquire) {
        chosen @ (SYSTEM | MIMALLOC) => return chosen,
        DECIDING => {
            // A nested or concurrent allocation while the command line is read.
            ALLOCATED_WHILE_DECIDING.store(true, Ordering::Release);
            return SYSTEM;
        }
        _ => {}
    }
    if CHOICE
        .compare_exchange(UNDECIDED, DECIDING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread is deciding right now.
        ALLOCATED_WHILE_DECIDING.store(true, Ordering::Release);
        return SYSTEM;
    }
    let mut buffer = [0u8; 256];
    let mut decided = choose(cmdline(&mut buffer));
    if ALLOCATED_WHILE_DECIDING.load(Ordering::Acquire) {
        decided = SYSTEM;
    }
    CHOICE.store(decided, Ordering::Release);
    decided
}

// SAFETY: every call is forwarded to one of two sound allocators, always the same one for
// the life of the process (`choice` never changes once made).
unsafe impl GlobalAlloc for ByCommand {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is forwarded unchanged.
        unsafe {
            if choice() == MIMALLOC {
                mimalloc::MiMalloc.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if choice() == MIMALLOC {
                mimalloc::MiMalloc.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the same allocator (the choice never changes).
        unsafe {
            if choice() == MIMALLOC {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`.
        unsafe {
            if choice() == MIMALLOC {
                mimalloc::MiMalloc.realloc(ptr, layout, new_size)
            } else {
                System.realloc(ptr, layout, new_size)
            }
        }
    }
}

/// Which allocator this process runs on (for logs and tests).
pub fn name() -> &'static str {
    if choice() == MIMALLOC {
        "mimalloc"
    } else {
        "system"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_plane_gets_mimalloc_and_hosts_keep_the_system_allocator() {
        for (cmdline, expected) in [
            (&b"rlark\0server\0--data-dir\0/d\0"[..], MIMALLOC),
            (b"/usr/bin/rlark\0up\0--demo\0", MIMALLOC),
            // `rlark bench` execs rlark-bench (on mimalloc itself) at once.
            (b"rlark\0bench\0api\0", SYSTEM),
            (b"rlark\0controller-manager\0", MIMALLOC),
            (b"rlark\0agent\0--server\0https://a\0", SYSTEM),
            (b"rlark\0supervise\0--\0true\0", SYSTEM),
            (b"rlark\0get\0jobs\0", SYSTEM),
            (b"rlark\0--log-format\0json\0server\0", SYSTEM),
            (b"rlark\0", SYSTEM),
            (b"", SYSTEM),
            // argv[1] cut short by the read buffer is not a match.
            (b"rlark\0serv", SYSTEM),
        ] {
            assert_eq!(
                choose(cmdline),
                expected,
                "{:?}",
                String::from_utf8_lossy(cmdline)
            );
        }
    }

    #[test]
    fn the_command_line_is_readable() {
        let mut buffer = [0u8; 256];
        let args = cmdline(&mut buffer);
        assert!(!args.is_empty(), "/proc/self/cmdline is readable");
        // The test binary's argv[0] is this process's executable.
        assert!(
            args.split(|&b| b == 0)
                .next()
                .is_some_and(|a| !a.is_empty())
        );
    }
}
