//! `config-snapshot serve` as a process: the real binary, on loopback, with
//! a throwaway certificate, its logs captured.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::paths::policy;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The child's stdout and stderr, line by line, into one string, read on
/// threads of their own so that the child never blocks on a full pipe.
pub fn capture_logs(child: &mut Child) -> Arc<Mutex<String>> {
    let logs = Arc::new(Mutex::new(String::new()));
    for stream in [
        Box::new(child.stdout.take().expect("stdout piped")) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().expect("stderr piped")),
    ] {
        let logs = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let mut logs = logs.lock().unwrap();
                logs.push_str(&line);
                logs.push('\n');
            }
        });
    }
    logs
}

/// The signing key the harness gives serve (`--signing-key-file`) unless
/// a test asks for another: snapshots' names are keyed by it.
pub const HARNESS_KEY: [u8; 32] = [42; 32];

pub struct ServeProcess {
    pub child: Child,
    pub webhook: SocketAddr,
    pub ops: SocketAddr,
    /// The serving certificate (PEM): the webhook's caBundle.
    pub cert_pem: String,
    logs: Arc<Mutex<String>>,
    pub dir: PathBuf,
    /// The serve binary: this build's, or another's to compare against.
    binary: PathBuf,
}

impl ServeProcess {
    /// Starts serve with `kubeconfig` and `extra` flags; a fresh certificate
    /// for 127.0.0.1 in a directory of its own.
    pub fn start(kubeconfig: &Path, extra: &[&str]) -> ServeProcess {
        Self::start_logging(kubeconfig, extra, "debug")
    }

    /// As [`ServeProcess::start`], logging at `level` (`RUST_LOG`): the load
    /// test runs at the shipped level, `info`.
    pub fn start_logging(kubeconfig: &Path, extra: &[&str], level: &str) -> ServeProcess {
        Self::start_build(Self::this_build(), kubeconfig, extra, level)
    }

    /// This build's `config-snapshot` binary.
    pub fn this_build() -> &'static Path {
        Path::new(env!("CARGO_BIN_EXE_config-snapshot"))
    }

    /// As [`ServeProcess::start_logging`], with `binary` in place of this
    /// build's serve: another build, measured in the same run.
    pub fn start_build(binary: &Path, kubeconfig: &Path, extra: &[&str], level: &str) -> ServeProcess {
        let dir = std::env::temp_dir().join(format!("config-snapshot-serve-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert_pem = cert.cert.pem();
        std::fs::write(dir.join("tls.crt"), &cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
        Self::start_in(binary, dir, cert_pem, kubeconfig, extra, free_port(), level)
    }

    /// Starts serve again with the same certificate and webhook port.
    pub fn restart(&mut self, kubeconfig: &Path, extra: &[&str]) {
        self.stop();
        *self = Self::start_in(
            &self.binary.clone(),
            self.dir.clone(),
            self.cert_pem.clone(),
            kubeconfig,
            extra,
            self.webhook.port(),
            "debug",
        );
    }

    fn start_in(
        binary: &Path,
        dir: PathBuf,
        cert_pem: String,
        kubeconfig: &Path,
        extra: &[&str],
        port: u16,
        level: &str,
    ) -> ServeProcess {
        let webhook: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let ops: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        // The built policy, unless the caller names another module.
        let policy_args = if extra.contains(&"--policy") {
            vec![]
        } else {
            vec!["--policy".into(), policy().into_os_string()]
        };
        // A fixed signing key from a file, unless the caller wants serve to
        // keep it in a Secret (`--signing-key-secret`).
        let key_args = if extra.contains(&"--signing-key-secret") || extra.contains(&"--signing-key-file") {
            vec![]
        } else {
            let key = dir.join("signing.key");
            std::fs::write(&key, HARNESS_KEY).unwrap();
            vec!["--signing-key-file".into(), key.into_os_string()]
        };
        // The harness registers serve itself (or has no webhook
        // configuration at all, as with the stand-in API server), unless
        // the caller asks serve to keep one on the door's path.
        let registration_args: Vec<std::ffi::OsString> =
            if extra.iter().any(|a| a.starts_with("--webhook-configuration")) {
                vec![]
            } else {
                vec!["--webhook-configuration=".into()]
            };
        let mut child = Command::new(binary)
            .arg("serve")
            .args(policy_args)
            .args(key_args)
            .args(registration_args)
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .args(["--listen", &webhook.to_string(), "--metrics-listen", &ops.to_string()])
            .args(["--log-format", "json"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", level)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        let logs = capture_logs(&mut child);
        ServeProcess {
            child,
            webhook,
            ops,
            cert_pem,
            logs,
            dir,
            binary: binary.to_path_buf(),
        }
    }

    /// serve's resident set, in bytes (`/proc`).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .unwrap()
    }

    /// The door's path (docs/security.md, "The door") of a serve that
    /// signs with the key file the harness wrote for it.
    pub fn door_path(&self) -> String {
        let key = std::fs::read(self.dir.join("signing.key")).expect("serve signs with the harness's key file");
        let ring = config_snapshot::cluster::proof::Keyring::of(&key).unwrap();
        config_snapshot::serve::intake::door::path_of(&ring, config_snapshot_policy::model::duration::unix_now())
            .to_string()
    }

    /// A plain HTTP GET on the ops port: (status, body).
    pub fn ops_get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect(self.ops).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
    }

    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some((200, _)) = self.ops_get("/readyz") {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("serve exited with {status}:\n{}", self.logs());
            }
            assert!(Instant::now() < deadline, "serve never became ready:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The exit status, if serve has exited.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.ops_get("/metrics").expect("metrics");
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}
