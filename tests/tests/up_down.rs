//! `tessera up` and `tessera down`: the one-command local cluster, restarted on the same
//! state directory, brings every file back; `down` leaves nothing running or mounted.

use std::fs;
use std::process::Command;

fn tessera(args: &[&str]) -> String {
    let bin = tessera_tests::process::bin_dir().join("tessera");
    let out = Command::new(&bin)
        .args(args)
        .output()
        .expect("tessera runs");
    assert!(
        out.status.success(),
        "tessera {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `tessera down` when dropped, so a failing test leaves nothing behind.
struct Down(Vec<String>);

impl Drop for Down {
    fn drop(&mut self) {
        let args: Vec<&str> = self.0.iter().map(String::as_str).collect();
        let bin = tessera_tests::process::bin_dir().join("tessera");
        let _ = Command::new(bin).args(&args).output();
    }
}

fn pids(state: &std::path::Path) -> Vec<i32> {
    fs::read_to_string(state.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' ')?.1.trim().parse().ok())
        .collect()
}

#[test]
fn up_down_up_keeps_every_file() {
    tessera_tests::process::require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let state = dir.path().join("state");
    let (m, s) = (
        mnt.to_string_lossy().into_owned(),
        state.to_string_lossy().into_owned(),
    );
    let _guard = Down(vec![
        "down".into(),
        m.clone(),
        "--state-dir".into(),
        s.clone(),
    ]);
    let out = tessera(&["up", &m, "--state-dir", &s]);
    assert!(out.contains("mounted"), "{out}");
    assert!(fs_client::cluster::is_mounted(&mnt));
    assert_eq!(pids(&state).len(), 5, "meta, 3 data servers, mount");
    fs::create_dir(mnt.join("dir")).unwrap();
    let data = tessera_tests::pseudo_random(9 << 20, 11);
    fs::write(mnt.join("dir/file"), &data).unwrap();

    let started = pids(&state);
    tessera(&["down", &m, "--state-dir", &s]);
    assert!(!fs_client::cluster::is_mounted(&mnt));
    for pid in started {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'));
        assert!(stat.is_empty() || !running, "pid {pid} stopped");
    }
    // A data server stopped by SIGTERM saves its usage for its next start, which takes it.
    let usage_files = || -> Vec<bool> {
        (0..3)
            .map(|i| state.join(format!("data-{i}/usage")).exists())
            .collect()
    };
    assert_eq!(usage_files(), [true; 3], "usage saved at the stop");

    tessera(&["up", &m, "--state-dir", &s]);
    assert_eq!(usage_files(), [false; 3], "usage taken at the start");
    assert_eq!(fs::read(mnt.join("dir/file")).unwrap(), data);
    // The servers came back on new ports: writes after the restart (every chain gets
    // some) must succeed and read back. (That peers learn the new addresses at all is
    // checked in the metadata server's unit tests: a moved server bumps the map version.)
    for i in 0..24u64 {
        let path = mnt.join(format!("dir/after-{i}"));
        let bytes = tessera_tests::pseudo_random(300 << 10, 100 + i);
        fs::write(&path, &bytes).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }
    tessera(&["down", &m, "--state-dir", &s]);
    assert!(!fs_client::cluster::is_mounted(&mnt));
}
