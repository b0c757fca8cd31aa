//! The guardian's dormant first life (x86_64 and aarch64 Linux): a `clone(CLONE_VM)` child of
//! the wrapper — no page tables copied, and no copy-on-write fault in the wrapper afterwards,
//! which is what a `fork` per run cost `leasehold run L -- true` — that waits until the
//! wrapper's end of its socket is closed, or [`DORMANT_FOR`] has passed, then execs the
//! guardian proper (`/proc/self/exe --leasehold-guardian`), which reads what the arming left
//! (or will leave) in the socket — the message and the lock's descriptors, kept open in flight
//! meanwhile — and serves. A dismissed guardian dies in its wait, having run nothing but its
//! setting up. Why a time limit: a process sharing the wrapper's memory shares its fate under
//! the OOM killer, which kills every process of a victim's memory; a guardian with its own
//! must outlive an OOM-killed wrapper, so one that is still needed after a short run's length
//! takes its own (one exec, off the wrapper's path).
//!
//! Owns: the clone, and the child's life until its exec: its own process group, the socket on
//! descriptor 3, /dev/null on 0 and 1 (and on 2 where the wrapper had no stderr), nothing else
//! open, then the name `lh-guardian`; the wait, bounded by [`DORMANT_FOR`]; the exec, with a
//! copy of the wrapper's environment taken before the clone.
//! Must never: in the child, run anything but raw system calls (`sys`) on memory prepared
//! before the clone and never freed — the child shares the wrapper's memory and its thread
//! pointer, so a libc call could write the wrapper's `errno` or take its allocator's lock —;
//! return from the child; free what the child may still read (the prepared values and the
//! child's stack are left to the process's end: once per run).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStringExt;
use std::ptr;
use std::time::Duration;

use nix::libc::{self, c_char, c_int, c_long, c_void};
use nix::unistd::Pid;

/// How long the guardian stays dormant at most: far beyond a short run (`run L -- true` takes a
/// few ms), short beside a job worth an OOM kill.
const DORMANT_FOR: Duration = Duration::from_secs(1);

/// The child's stack: it makes a handful of system calls from two frames.
const STACK: usize = 64 * 1024;

/// Everything the child reads, built before the clone and never freed.
struct Prepared {
    rx: RawFd,
    tx: RawFd,
    envp: *const *const c_char,
    argv: [*const c_char; 3],
}

/// Clones the dormant guardian with `rx` (its end of the socket; `tx` is ours) and returns its
/// pid. Call with every signal blocked (they stay blocked in the child until the exec'd
/// guardian settles them: [`super::settle_signals`]).
pub(super) fn clone(rx: RawFd, tx: RawFd) -> std::io::Result<Pid> {
    let env: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut b = k.into_vec();
            b.push(b'=');
            b.extend(v.into_vec());
            CString::new(b).ok()
        })
        .collect();
    let env: &'static [CString] = Box::leak(env.into_boxed_slice());
    let envp: Vec<*const c_char> = env
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect();
    let envp: &'static [*const c_char] = Box::leak(envp.into_boxed_slice());
    let prepared: &'static Prepared = Box::leak(Box::new(Prepared {
        rx,
        tx,
        envp: envp.as_ptr(),
        argv: [
            c"leasehold".as_ptr(),
            c"--leasehold-guardian".as_ptr(),
            ptr::null(),
        ],
    }));
    // SAFETY: a fresh private anonymous mapping, nobody else's memory.
    let stack = unsafe {
        libc::mmap(
            ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `child` runs on the top of the fresh stack, on `prepared` (never freed), making
    // raw system calls only, and never returns; SIGCHLD makes it a child we reap as any other.
    let pid = unsafe {
        libc::clone(
            child,
            stack.cast::<u8>().add(STACK).cast(),
            libc::CLONE_VM | libc::SIGCHLD,
            ptr::from_ref(prepared).cast_mut().cast(),
        )
    };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: no child runs on it.
        unsafe { libc::munmap(stack, STACK) };
        return Err(e);
    }
    Ok(Pid::from_raw(pid))
}

/// The child: set up, wait for the wrapper's end to close, exec the guardian proper.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Prepared` leaked by `clone`.
    let p = unsafe { &*arg.cast::<Prepared>() };
    const PIPE: c_long = super::PIPE_FD as c_long;
    // SAFETY: raw system calls on values that live as long as the process (see the module).
    unsafe {
        sys(libc::SYS_setpgid, [0, 0, 0, 0, 0]);
        let rx = p.rx as c_long;
        if rx == PIPE {
            sys(libc::SYS_fcntl, [PIPE, libc::F_SETFD as c_long, 0, 0, 0]);
        } else if sys(libc::SYS_dup3, [rx, PIPE, 0, 0, 0]) < 0 {
            sys(libc::SYS_exit_group, [1, 0, 0, 0, 0]);
        }
        // Everything of the wrapper's but the standard three goes: its end of the socket, its
        // locks' descriptors, its lease files.
        if sys(
            libc::SYS_close_range,
            [PIPE + 1, c_long::from(u32::MAX), 0, 0, 0],
        ) != 0
        {
            for fd in PIPE + 1..4096 {
                sys(libc::SYS_close, [fd, 0, 0, 0, 0]);
            }
        }
        let null = sys(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as c_long,
                c"/dev/null".as_ptr() as c_long,
                (libc::O_RDWR | libc::O_CLOEXEC) as c_long,
                0,
                0,
            ],
        );
        if null >= 0 {
            sys(libc::SYS_dup3, [null, 0, 0, 0, 0]);
            sys(libc::SYS_dup3, [null, 1, 0, 0, 0]);
            // A socket on 2 (the wrapper had no stderr): not kept, least of all the wrapper's end,
            // whose copy here would hide its closing.
            if rx == 2 || p.tx == 2 {
                sys(libc::SYS_dup3, [null, 2, 0, 0, 0]);
            }
            sys(libc::SYS_close, [null, 0, 0, 0, 0]);
        }
        // Named once set up: who finds `lh-guardian` finds it holding only what it keeps.
        sys(
            libc::SYS_prctl,
            [
                libc::PR_SET_NAME as c_long,
                c"lh-guardian".as_ptr() as c_long,
                0,
                0,
                0,
            ],
        );
        // POLLHUP is reported whatever the events asked: nothing but the wrapper's end closing
        // (or an error on ours) wakes this before the time is up. The kernel may write what is
        // left of the time back (the child's own stack).
        let mut pfd = libc::pollfd {
            fd: super::PIPE_FD,
            events: 0,
            revents: 0,
        };
        let mut left = libc::timespec {
            tv_sec: DORMANT_FOR.as_secs() as _,
            tv_nsec: DORMANT_FOR.subsec_nanos() as _,
        };
        loop {
            let r = sys(
                libc::SYS_ppoll,
                [
                    ptr::from_mut(&mut pfd) as c_long,
                    1,
                    ptr::from_mut(&mut left) as c_long,
                    0,
                    0,
                ],
            );
            if r != -(libc::EINTR as c_long) {
                break;
            }
        }
        sys(
            libc::SYS_execve,
            [
                c"/proc/self/exe".as_ptr() as c_long,
                p.argv.as_ptr() as c_long,
                p.envp as c_long,
                0,
                0,
            ],
        );
        sys(libc::SYS_exit_group, [127, 0, 0, 0, 0]);
    }
    127
}

/// A raw system call: the kernel's result (a negated errno on failure), `errno` untouched.
///
/// # Safety
/// As the system call `n` with these arguments.
#[cfg(target_arch = "x86_64")]
unsafe fn sys(n: c_long, a: [c_long; 5]) -> c_long {
    let r: c_long;
    // SAFETY: the x86_64 Linux system call convention; rcx and r11 are clobbered.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") n => r,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    r
}

/// A raw system call: the kernel's result (a negated errno on failure), `errno` untouched.
///
/// # Safety
/// As the system call `n` with these arguments.
#[cfg(target_arch = "aarch64")]
unsafe fn sys(n: c_long, a: [c_long; 5]) -> c_long {
    let r: c_long;
    // SAFETY: the aarch64 Linux system call convention.
    unsafe {
        std::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a[0] => r,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            in("x4") a[4],
            options(nostack),
        );
    }
    r
}
