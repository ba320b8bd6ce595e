//! A helper process driven line by line over its stdin. It opens files, takes and drops
//! locks, reads and writes, and answers each command with one line. Tests use agents as
//! the other processes of a POSIX scenario (a lock holder, a waiter, the reader of an
//! unlinked file), each with its own pid, as root or as an unprivileged user.

use crate::posix::{User, PYTHON};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long an agent may take to start or to answer a command that does not block.
pub const ANSWER: Duration = Duration::from_secs(30);

/// The agent's program. Commands (`KEY` names an open descriptor):
/// `open KEY PATH r|w|rw|a|c|rwd` (`rwd`: `O_RDWR | O_DIRECT`, past the page cache),
/// `close KEY`, `flock KEY ex|sh|un [nb]`,
/// `lock KEY ex|sh|un START LEN [wait]` (fcntl locks through `lockf`),
/// `ofd KEY ex|sh|un START LEN [wait]` (open file description locks, `F_OFD_SETLK[W]`),
/// `pwrite KEY OFFSET TEXT`, `pread KEY OFFSET LEN`, `sha KEY`, `fstat KEY`,
/// `fsync KEY`, `exit`. Answers: `ok [value]`, `err ERRNO_NAME`, or `bad ...` for a
/// command the agent did not understand.
const SCRIPT: &str = r#"
import errno, fcntl, hashlib, os, struct, sys
fds = {}
FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR,
         "a": os.O_WRONLY | os.O_APPEND, "c": os.O_RDWR | os.O_CREAT,
         "rwd": os.O_RDWR | os.O_DIRECT}
LOCKS = {"ex": fcntl.LOCK_EX, "sh": fcntl.LOCK_SH, "un": fcntl.LOCK_UN}
def sha(fd):
    h, off = hashlib.sha256(), 0
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            return "%s %d" % (h.hexdigest(), off)
        h.update(b)
        off += len(b)
def do(op, a):
    if op == "exit":
        sys.stdout.flush()
        os._exit(0)
    if op == "open":
        fds[a[0]] = os.open(a[1], FLAGS[a[2]], 0o644)
        return None
    fd = fds[a[0]]
    if op == "close":
        os.close(fds.pop(a[0]))
    elif op == "flock":
        fcntl.flock(fd, LOCKS[a[1]] | (fcntl.LOCK_NB if "nb" in a[2:] else 0))
    elif op == "lock":
        nb = 0 if "wait" in a[4:] or a[1] == "un" else fcntl.LOCK_NB
        fcntl.lockf(fd, LOCKS[a[1]] | nb, int(a[3]), int(a[2]))
    elif op == "ofd":
        cmd = fcntl.F_OFD_SETLKW if "wait" in a[4:] else fcntl.F_OFD_SETLK
        typ = {"ex": fcntl.F_WRLCK, "sh": fcntl.F_RDLCK, "un": fcntl.F_UNLCK}[a[1]]
        fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", typ, 0, int(a[2]), int(a[3]), 0))
    elif op == "pwrite":
        return os.pwrite(fd, a[2].encode(), int(a[1]))
    elif op == "pread":
        return os.pread(fd, int(a[2]), int(a[1])).decode(errors="replace")
    elif op == "sha":
        return sha(fd)
    elif op == "fstat":
        st = os.fstat(fd)
        return "%d %d" % (st.st_size, st.st_nlink)
    elif op == "fsync":
        os.fsync(fd)
    else:
        raise ValueError(op)
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    op, *args = line.split()
    try:
        r = do(op, args)
    except OSError as e:
        print("err", errno.errorcode.get(e.errno, e.errno), flush=True)
    except Exception as e:
        print("bad", repr(e).replace("\n", " "), flush=True)
    else:
        print("ok" if r is None else "ok %s" % (r,), flush=True)
"#;

/// A running agent; killed (SIGKILL) and reaped when dropped.
pub struct Agent {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Agent {
    /// Starts an agent running as `user`; `name` appears in failure messages.
    pub fn start(user: &User, name: &str) -> Agent {
        let mut child = user
            .command(PYTHON)
            .arg("-I")
            .arg("-u")
            .arg("-c")
            .arg(SCRIPT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("agent starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut agent = Agent {
            name: name.to_string(),
            child,
            stdin,
            lines,
        };
        let hello = agent.reply(ANSWER);
        assert!(
            hello.as_deref().is_some_and(|l| l.starts_with("ready ")),
            "agent {name} did not start: {hello:?}"
        );
        agent
    }

    /// The agent's process id (setpriv execs the interpreter in place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a command without waiting for its answer (for one that blocks).
    pub fn send(&mut self, cmd: &str) {
        let stdin = self.stdin.as_mut().expect("agent stdin open");
        writeln!(stdin, "{cmd}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("agent {}: sending {cmd}: {e}", self.name));
    }

    /// The next answer, if one comes within `within`.
    pub fn reply(&mut self, within: Duration) -> Option<String> {
        match self.lines.recv_timeout(within) {
            Ok(l) => Some(l),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Sends `cmd` and returns its answer; panics if none comes within [`ANSWER`] or
    /// the agent is gone.
    pub fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        match self.lines.recv_timeout(ANSWER) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                panic!("agent {}: no answer to `{cmd}` in {ANSWER:?}", self.name)
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("agent {}: exited instead of answering `{cmd}`", self.name)
            }
        }
    }

    /// Sends `cmd` and asserts its answer.
    pub fn expect(&mut self, cmd: &str, want: &str) {
        let got = self.ask(cmd);
        assert_eq!(got, want, "agent {}: `{cmd}`", self.name);
    }

    /// Kills the agent with SIGKILL and reaps it. The wait is bounded: a process stuck
    /// in a request to a mount that never answers is left behind (and said so) rather
    /// than hanging the test; the mount's own cleanup then frees it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let deadline = Instant::now() + ANSWER;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "agent {} (pid {}) did not die in {ANSWER:?}",
            self.name,
            self.pid()
        );
    }

    /// Sends `signal` to the agent without waiting for anything.
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child by its pid (not yet reaped: `child` holds it).
        let r = unsafe { libc::kill(self.pid() as i32, signal) };
        assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Waits for the agent to exit within `within`; panics if it does not.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "agent {} still running after {within:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stdin.take();
        self.kill();
    }
}
