//! A loop of exclusive creates, renames, unlinks, mkdirs and `O_APPEND` writes through a
//! mount, in a Python process of its own, run across the death of a metadata server:
//! every call must succeed (a create or mkdir applied twice fails `EEXIST`, a rename or
//! unlink `ENOENT`, an append applied twice leaves its line twice), and the folder ends
//! as the loop made it, once.
//!
//! A process of its own: a test process that starts another metadata server must not
//! hold files of the mount (the child's copies of their descriptors are closed at its
//! `exec`, a FUSE flush, which waits for the metadata server the child is about to be).

use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The loop; prints `go` after its `before`-th iteration. It works in `<root>/w`, a
/// folder it makes: the mount knows every name there, so the kernel's lookups of new
/// names are answered without a call and nearly every call is a change.
const CHANGE_LOOP: &str = r#"
import os, sys, time
root, loops, before = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
longest = (0.0, "")
root = os.path.join(root, "w")
os.mkdir(root)
log = os.open(os.path.join(root, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
for i in range(loops):
    f, r = os.path.join(root, f"f{i}"), os.path.join(root, f"r{i}")
    def step(what, fn):
        global longest
        t = time.monotonic()
        try:
            fn()
        except OSError as e:
            sys.exit(f"loop {i}: {what}: {e}")
        longest = max(longest, (time.monotonic() - t, f"loop {i}: {what}"))
    step("exclusive create", lambda: os.close(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)))
    step("rename", lambda: os.rename(f, r))
    if i % 3 == 0:
        step("unlink", lambda: os.unlink(r))
    if i % 5 == 0:
        step("mkdir", lambda: os.mkdir(os.path.join(root, f"d{i}")))
    step("append", lambda: os.write(log, f"line {i}\n".encode()))
    if i == before:
        print("go", flush=True)
step("fsync", lambda: os.fsync(log))
os.close(log)
print(f"longest {longest[0]:.6f} {longest[1]}", flush=True)
"#;

/// A running loop (killed if dropped before it ended).
pub struct ChangeLoop {
    child: Child,
    root: PathBuf,
    loops: usize,
    /// The rest of the loop's output, read when it ends.
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl ChangeLoop {
    /// Starts `loops` iterations in `<root>/w` and returns once `before` of them are
    /// done (at most `limit`).
    pub fn start(root: &Path, loops: usize, before: usize, limit: Duration) -> ChangeLoop {
        let mut child = Command::new("python3")
            .args(["-c", CHANGE_LOOP])
            .arg(root)
            .args([loops.to_string(), before.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        let stdout = child.stdout.take().expect("stdout");
        let mut run = ChangeLoop {
            child,
            root: root.to_path_buf(),
            loops,
            stdout: None,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // One reader for the whole output: `go`, then the longest call at the end.
        run.stdout = Some(std::thread::spawn(move || {
            let mut out = std::io::BufReader::new(stdout);
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            let _ = tx.send(line);
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut rest);
            rest
        }));
        let go = crate::bounded("the loop's first changes", limit, move || {
            rx.recv().unwrap_or_default()
        });
        if go.trim() != "go" {
            panic!(
                "the loop stopped before its first changes: {}",
                run.stderr()
            );
        }
        run
    }

    fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        err
    }

    /// Waits at most `limit` for the loop to end, and checks that every call succeeded
    /// and that its folder holds what it made, once; returns how long its longest call
    /// took, and which it was.
    pub fn finish(mut self, limit: Duration) -> (Duration, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the loop did not end within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let err = self.stderr();
        assert!(status.success(), "the loop failed ({status}): {err}");
        let out = self.stdout.take().map(|r| r.join().unwrap_or_default());
        let longest = out
            .as_deref()
            .and_then(|o| o.trim().strip_prefix("longest "))
            .and_then(|l| l.split_once(' '))
            .and_then(|(secs, what)| Some((secs.parse::<f64>().ok()?, what.to_string())))
            .unwrap_or_else(|| panic!("no longest call in the loop's output: {out:?}"));
        let mut want: Vec<String> = vec!["log".into()];
        for i in 0..self.loops {
            if i % 3 != 0 {
                want.push(format!("r{i}"));
            }
            if i % 5 == 0 {
                want.push(format!("d{i}"));
            }
        }
        want.sort();
        let w = self.root.join("w");
        assert_eq!(names(&w), want);
        let lines: String = (0..self.loops).map(|i| format!("line {i}\n")).collect();
        let log = fs::read_to_string(w.join("log")).expect("read the log");
        assert!(
            log == lines,
            "the log differs from the lines written once each:\n{log}"
        );
        (Duration::from_secs_f64(longest.0), longest.1)
    }
}

/// The names in folder `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// Checks that each of `folders` lists the same names under mount `a` as under mount
/// `b` (two mounts of one namespace, after loops through each).
pub fn listed_alike(a: &Path, b: &Path, folders: &[&str]) {
    for f in folders {
        assert_eq!(names(&a.join(f)), names(&b.join(f)), "{f} differs");
    }
}

impl Drop for ChangeLoop {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
