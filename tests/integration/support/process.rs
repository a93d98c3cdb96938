//! Files and the built binary: temporary config files, and magpie run as a
//! child process whose stderr is followed line by line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use super::PATIENCE;

static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file in Cargo's scratch directory for integration tests, removed on drop.
pub struct TempFile {
    pub path: PathBuf,
}

impl TempFile {
    /// Writes `text` to a fresh directory as `name`, so messages can name the file.
    pub fn new(name: &str, text: &str) -> TempFile {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "magpie-{}-{}",
            std::process::id(),
            FILE_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        TempFile { path }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent()
            && let Err(e) = std::fs::remove_dir_all(dir)
        {
            eprintln!("cannot remove {}: {e}", dir.display());
        }
    }
}

/// The `magpie` binary Cargo built for these tests.
pub fn magpie_bin() -> &'static str {
    env!("CARGO_BIN_EXE_magpie")
}

/// The `magpie` binary running as a child process, its stderr read line by line.
pub struct Child {
    pub process: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every stderr line seen so far, for failure messages.
    pub log: Vec<String>,
}

impl Child {
    pub fn spawn(args: &[&str]) -> Child {
        let mut command = tokio::process::Command::new(magpie_bin());
        command.args(args);
        Child::spawn_command(command)
    }

    /// Runs magpie with at most `fds` open file descriptors (`ulimit -n`).
    pub fn spawn_with_fd_limit(fds: u32, args: &[&str]) -> Child {
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg("ulimit -n \"$0\" && exec \"$@\"")
            .arg(fds.to_string())
            .arg(magpie_bin())
            .args(args);
        Child::spawn_command(command)
    }

    /// Runs magpie with `socket` as its fd 3 and `LISTEN_FDS=1`, as
    /// systemd's socket activation hands a listening (or UDP) socket over.
    pub fn spawn_activated(socket: &impl std::os::fd::AsFd, args: &[&str]) -> Child {
        use command_fds::{CommandFdExt, FdMapping};
        let fd = (socket.as_fd().try_clone_to_owned()).expect("dup the socket");
        let mut command = std::process::Command::new(magpie_bin());
        command
            .args(args)
            .env("LISTEN_FDS", "1")
            .env_remove("LISTEN_PID");
        command
            .fd_mappings(vec![FdMapping {
                parent_fd: fd,
                child_fd: 3,
            }])
            .expect("fd 3 is free in the child");
        Child::spawn_command(tokio::process::Command::from(command))
    }

    pub fn spawn_command(mut command: tokio::process::Command) -> Child {
        let mut process = command
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
        let stderr = process.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Child {
            process,
            lines,
            log: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub async fn wait_for_line(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = self.lines.recv().await {
                self.log.push(line.clone());
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            Ok(None) => panic!(
                "magpie's stderr ended without {needle:?}:\n{}",
                self.log.join("\n")
            ),
            Err(_) => panic!(
                "no {needle:?} on magpie's stderr within {PATIENCE:?}:\n{}",
                self.log.join("\n")
            ),
        }
    }

    /// Every stderr line seen so far, the ones not yet read included.
    pub fn lines_so_far(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(line);
        }
        &self.log
    }

    /// Where magpie serves traffic: its first `listening role=proxy addr=…` line.
    pub async fn listen_addr(&mut self) -> SocketAddr {
        self.addr_of("proxy").await
    }

    /// Where magpie's admin endpoint listens: its `listening role=admin` line.
    pub async fn admin_addr(&mut self) -> SocketAddr {
        self.addr_of("admin").await
    }

    /// The `addr=` of the `listening role=ROLE` line magpie logs per socket.
    async fn addr_of(&mut self, role: &str) -> SocketAddr {
        let line = self.wait_for_line(&format!("listening role={role} ")).await;
        line.split_whitespace()
            .find_map(|field| field.strip_prefix("addr="))
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("no addr=IP:PORT in {line:?}"))
    }

    /// Sends a signal (`-TERM`, `-HUP`, ...) with `kill`.
    pub fn signal(&self, which: &str) {
        let status = std::process::Command::new("kill")
            .args([which, &self.pid()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {which} failed");
    }

    pub fn pid(&self) -> String {
        self.process
            .id()
            .expect("the process has not been reaped yet")
            .to_string()
    }
}
