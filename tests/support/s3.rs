//! A real S3 server for the S3 store's tests: Ceph RADOS Gateway (`tests/s3/ceph.sh`), one per
//! test binary. [`gateway`] uses the one `.ci/run` started (`LH_S3_ENV` names its env file),
//! or starts one in a scratch directory, with a watchdog that stops every daemon (by pid) once
//! this test binary has exited; it skips — fails under CI — where Ceph is not installed.
//! [`Gateway::cmd`] is `leasehold` with the gateway's AWS environment; the second gateway
//! ([`Gateway::freezable`]) serves the same buckets for tests that SIGSTOP it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::cli::lh;
use super::env::{have, skip};

pub struct Gateway {
    pub env: HashMap<String, String>,
    pub bucket: String,
}

impl Gateway {
    /// `leasehold` with this gateway's endpoint and keys.
    pub fn cmd(&self) -> Command {
        let mut c = lh();
        self.apply(&mut c);
        c
    }

    /// Gives `c` this gateway's endpoint and keys.
    pub fn apply(&self, c: &mut Command) {
        for k in [
            "AWS_ENDPOINT_URL_S3",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
        ] {
            c.env(k, &self.env[k]);
        }
        c.env_remove("AWS_ENDPOINT_URL").env_remove("AWS_PROFILE");
    }

    /// `leasehold` through the second gateway, which a test may freeze.
    pub fn cmd_freezable(&self) -> Command {
        let mut c = self.cmd();
        c.env("AWS_ENDPOINT_URL_S3", &self.env["LH_S3_FREEZABLE_ENDPOINT"]);
        c
    }

    /// The second gateway's pid.
    pub fn freezable(&self) -> i32 {
        self.env["LH_S3_FREEZABLE_PID"].parse().expect("a pid")
    }

    /// A fresh lock URL in the test bucket, unique to this process and `name`.
    pub fn url(&self, name: &str) -> String {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!(
            "s3://{}/t{}-{nonce}/{name}",
            self.bucket,
            std::process::id()
        )
    }
}

fn parse_env(path: &Path) -> Option<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/ceph.sh")
}

fn start() -> Result<Gateway, String> {
    if let Some(p) = std::env::var_os("LH_S3_ENV") {
        let env = parse_env(Path::new(&p)).ok_or(format!("cannot read LH_S3_ENV={p:?}"))?;
        let bucket = env.get("LH_S3_BUCKET").cloned().unwrap_or_default();
        return Ok(Gateway { env, bucket });
    }
    let missing: Vec<&str> = [
        "ceph-mon",
        "ceph-osd",
        "radosgw",
        "radosgw-admin",
        "uuidgen",
    ]
    .into_iter()
    .filter(|t| !have(t))
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "Ceph RGW not installed (missing {}): apt-get install --no-install-recommends \
             radosgw ceph-mon ceph-osd uuid-runtime",
            missing.join(", ")
        ));
    }
    let dir = std::env::temp_dir().join(format!("leasehold-ceph-{}", std::process::id()));
    let out = Command::new("bash")
        .arg(script())
        .args(["start", dir.to_str().unwrap_or_default()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("run ceph.sh: {e}"))?;
    // Stops every daemon once this test binary is gone, whatever way it ends.
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; bash {s} stop {d}",
        pid = std::process::id(),
        s = script().display(),
        d = dir.display()
    );
    let _ = Command::new("setsid")
        .args(["-f", "sh", "-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !out.status.success() {
        return Err(format!("tests/s3/ceph.sh start failed: {}", out.status));
    }
    let env = parse_env(&dir.join("env")).ok_or("ceph.sh wrote no env")?;
    let bucket = env.get("LH_S3_BUCKET").cloned().unwrap_or_default();
    Ok(Gateway { env, bucket })
}

/// The test binary's gateway, started at the first call; `None` (after saying why: a skip, or
/// under CI a failure) where it cannot be had.
#[track_caller]
pub fn gateway() -> Option<&'static Gateway> {
    static GW: OnceLock<Result<Gateway, String>> = OnceLock::new();
    match GW.get_or_init(start) {
        Ok(g) => Some(g),
        Err(why) => {
            skip(true, why);
            None
        }
    }
}
