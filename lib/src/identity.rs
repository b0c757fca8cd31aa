//! Who we are: host name, boot id, pid namespace and user, as written into leases and used to
//! decide whether a holder is "on this host".
//!
//! Owns: reading the real identity from the kernel, and the same-host rule (same host name AND
//! same boot id AND same pid namespace). Must never: treat a holder as same-host on a partial
//! match, since only then may local process checks decide its fate.

use std::fs;
use std::os::unix::fs::MetadataExt;

/// The identity of a host, boot and pid namespace, plus the user we run as.
///
/// Real values come from [`Identity::current`]; tests inject others to play foreign hosts.
///
/// ```
/// let me = leasehold::Identity::current();
/// assert!(!me.host.is_empty());
/// let mut other = me.clone();
/// other.host = "elsewhere".into();
/// assert!(me.same_host(&me));
/// assert!(!me.same_host(&other));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Host name (uname nodename).
    pub host: String,
    /// /proc/sys/kernel/random/boot_id: changes at every boot.
    pub boot_id: String,
    /// Inode number of /proc/self/ns/pid: PIDs mean something only within one namespace.
    pub pid_ns: u64,
    /// Real user id.
    pub uid: u32,
    /// User name, or the uid in decimal when it has none.
    pub user: String,
}

impl Identity {
    /// Reads the identity of this process from the kernel (once per process: it is cached).
    /// Never fails: fields that cannot be read are filled with values that never match another
    /// host's (empty boot id, namespace 0).
    pub fn current() -> Identity {
        static CACHE: std::sync::Mutex<Option<(u32, Identity)>> = std::sync::Mutex::new(None);
        let pid = std::process::id();
        let uid = nix::unistd::getuid().as_raw();
        if let Ok(c) = CACHE.lock()
            && let Some((p, id)) = c.as_ref()
            && *p == pid
            && id.uid == uid
        {
            return id.clone();
        }
        let id = Self::read();
        if let Ok(mut c) = CACHE.lock() {
            *c = Some((pid, id.clone()));
        }
        id
    }

    fn read() -> Identity {
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        let boot_id = boot_id().to_string();
        let pid_ns = fs::metadata("/proc/self/ns/pid")
            .map(|m| m.ino())
            .unwrap_or(0);
        let uid = nix::unistd::getuid();
        let user = user_name(uid.as_raw());
        Identity {
            host,
            boot_id,
            pid_ns,
            uid: uid.as_raw(),
            user,
        }
    }

    /// True when `other` is this very host, boot and pid namespace, so that PIDs recorded by it
    /// can be checked against our /proc. Unknown (empty or zero) parts never match.
    pub fn same_host(&self, other: &Identity) -> bool {
        self.same_host_as(&other.host, &other.boot_id, other.pid_ns)
    }

    /// As [`Identity::same_host`], against another's host name, boot id and pid namespace.
    pub(crate) fn same_host_as(&self, host: &str, boot_id: &str, pid_ns: u64) -> bool {
        !self.boot_id.is_empty()
            && self.pid_ns != 0
            && self.host == host
            && self.boot_id == boot_id
            && self.pid_ns == pid_ns
    }
}

/// This boot's id (/proc/sys/kernel/random/boot_id; empty when it cannot be read), read once
/// per process: it cannot change while the process lives, so callers that need only it (the
/// mutex's token line, at every take) skip [`Identity::current`]'s checks and copies.
pub(crate) fn boot_id() -> &'static str {
    static BOOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

/// The name of user `uid`: from /etc/passwd when it lists the uid (an open and a read, where a
/// lookup through NSS first asks nscd, reads nsswitch.conf and then the same file — a dozen
/// system calls on every run), else through NSS (LDAP, sssd, systemd users), else the uid in
/// decimal. The name is only shown and recorded, never trusted.
fn user_name(uid: u32) -> String {
    if let Ok(text) = fs::read("/etc/passwd")
        && let Some(name) = passwd_lookup(&text, uid)
    {
        return name;
    }
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// The first name /etc/passwd-formatted `text` gives to `uid`.
fn passwd_lookup(text: &[u8], uid: u32) -> Option<String> {
    let want = uid.to_string();
    text.split(|&b| b == b'\n').find_map(|line| {
        let mut f = line.split(|&b| b == b':');
        let name = f.next()?;
        let uid_field = f.nth(1)?;
        (uid_field == want.as_bytes() && !name.is_empty() && !name.starts_with(b"+"))
            .then(|| String::from_utf8_lossy(name).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::passwd_lookup;

    #[test]
    fn passwd_lookup_finds_the_uid_field_not_the_gid() {
        let text = b"root:x:0:0:root:/root:/bin/bash\nbob:x:1001:1000::/home/bob:/bin/sh\n\
                     carol:x:1000:1001::/home/carol:/bin/sh\n+@netgroup::::::\n";
        assert_eq!(passwd_lookup(text, 0).as_deref(), Some("root"));
        assert_eq!(passwd_lookup(text, 1000).as_deref(), Some("carol"));
        assert_eq!(passwd_lookup(text, 1001).as_deref(), Some("bob"));
        assert_eq!(passwd_lookup(text, 4242), None);
        assert_eq!(passwd_lookup(b"", 0), None);
    }
}
