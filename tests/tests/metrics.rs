//! Issue 26 items 1 and 2: every server and a mount serve Prometheus metrics over HTTP
//! on 127.0.0.1; after real traffic each endpoint has the named metrics, of the right
//! type, and the counters moved; `tessera top --once --json` and `tessera status
//! --json` show the same cluster to scripts.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;
use telemetry::text::{self, Scrape};
use tessera_tests::process::{bin_dir, ClusterOptions, ProcessCluster};

/// How long a process may take to write its metrics address.
const READY: Duration = Duration::from_secs(30);

fn scrape(addr: &str) -> Scrape {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = rt.block_on(telemetry::scrape(addr)).unwrap();
    text::parse(&body).unwrap()
}

fn addr(cluster: &ProcessCluster, name: &str) -> String {
    let mut found = None;
    tessera_tests::wait_until_blocking(&format!("{name}'s metrics address"), READY, || {
        found = cluster.metrics_addr(name);
        found.is_some()
    });
    let a = found.unwrap();
    assert!(a.starts_with("127.0.0.1:"), "{name} serves metrics on {a}");
    a
}

/// Asserts family `name` has type `kind`.
/// Asserts that each `(name, type)` of `expected` is served with that type.
fn typed(s: &Scrape, who: &str, expected: &[(&str, &str)]) {
    for &(name, kind) in expected {
        assert_eq!(s.kind(name), Some(kind), "{who}: type of {name}");
    }
}

/// Asserts `name{labels}` grew from `a` to `b` by at least `by`.
fn grew(who: &str, a: &Scrape, b: &Scrape, name: &str, labels: &[(&str, &str)], by: f64) {
    let (x, y) = (a.sum_where(name, labels), b.sum_where(name, labels));
    assert!(
        y - x >= by,
        "{who}: {name}{labels:?} went from {x} to {y}, want +{by}"
    );
}

/// Writes, syncs, reads and lists: every kind of call the checks below look for. The
/// file read was written by the other mount `other`, so its bytes come from the data
/// servers (its own writes a mount would read back from its caches).
fn traffic(dir: &std::path::Path, other: &std::path::Path) {
    let d = dir.join("work");
    fs::create_dir_all(&d).unwrap();
    let data: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
    for i in 0..20 {
        fs::write(d.join(format!("small-{i}")), b"hello").unwrap();
    }
    let mut f = fs::File::create(d.join("big")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut f = fs::File::create(other.join("other")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut back = Vec::new();
    let mut f = fs::File::open(dir.join("other")).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "read what the other mount wrote");
    assert_eq!(fs::read_dir(&d).unwrap().count(), 21);
}

/// Guards against an endpoint missing, serving a metric of the wrong type, or counters
/// that do not move with traffic, on the mount and on both kinds of server.
#[test]
fn every_endpoint_serves_the_named_metrics_and_they_move_with_traffic() {
    let cluster = ProcessCluster::start_with(ClusterOptions {
        data_servers: 2,
        metrics: true,
        ..ClusterOptions::default()
    });
    let mfile = cluster.dir().join("m.metrics");
    let conf = format!(
        "[metrics]\nlisten = \"127.0.0.1:0\"\naddr_file = \"{}\"\n",
        mfile.display()
    );
    let mount = cluster.mount_with_config("m", &conf);
    let writer = cluster.mount("w");
    let names = ["m", "meta", "data-0", "data-1"];
    let addrs: Vec<String> = names.iter().map(|n| addr(&cluster, n)).collect();
    let before: Vec<Scrape> = addrs.iter().map(|a| scrape(a)).collect();

    // `tessera top` over an interval that the traffic falls in.
    let mut top = Command::new(bin_dir().join("tessera"));
    top.args(["top", "--once", "--json", "--interval-ms", "3000"]);
    for a in &addrs {
        top.args(["--endpoint", a]);
    }
    let mut top = top
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    traffic(&mount.path, &writer.path);
    // Creates go on until `top` is done, so its interval holds some whenever its first
    // scrape came (a loaded machine may start it late).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for i in 0.. {
        if top.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
            break;
        }
        fs::write(mount.path.join(format!("work/more-{i}")), b"x").unwrap();
    }
    // A file held open: a session and an open file on the metadata server.
    let held = fs::File::open(mount.path.join("work/big")).unwrap();
    let after: Vec<Scrape> = addrs.iter().map(|a| scrape(a)).collect();
    let top = top.wait_with_output().unwrap();

    check_mount(&before[0], &after[0]);
    check_meta(&before[1], &after[1]);
    for (i, b) in before[2..].iter().enumerate() {
        check_data(&format!("data-{i}"), b, &after[2 + i]);
    }
    // Every chunk is written to both data servers: one takes it from the client, the
    // other down the chain.
    let moved = |dir| {
        after[2..]
            .iter()
            .map(|s| s.sum_where("tessera_data_bytes_total", &[("direction", dir)]))
            .sum::<f64>()
    };
    assert!(
        moved("written") >= f64::from(2u32 << 20),
        "written {}",
        moved("written")
    );
    assert!(
        moved("replicated") >= f64::from(2u32 << 20),
        "replicated {}",
        moved("replicated")
    );
    assert!(
        moved("read") >= f64::from(2u32 << 20),
        "read {}",
        moved("read")
    );
    drop(held);

    check_dashboard(&after);
    check_top(&top, &addrs);
    check_status_json(&cluster);
    mount.unmount();
    writer.unmount();
}

fn check_mount(a: &Scrape, b: &Scrape) {
    let who = "mount";
    typed(
        b,
        who,
        &[
            ("tessera_client_requests_total", "counter"),
            ("tessera_client_request_errors_total", "counter"),
            ("tessera_client_request_duration_seconds", "histogram"),
            ("tessera_client_data_bytes_total", "counter"),
            ("tessera_client_retries_total", "counter"),
            ("tessera_client_buffer_bytes", "gauge"),
            ("process_cpu_seconds_total", "counter"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_open_fds", "gauge"),
        ],
    );
    let create = [("server", "meta"), ("request", "create")];
    grew(who, a, b, "tessera_client_requests_total", &create, 21.0);
    grew(
        who,
        a,
        b,
        "tessera_client_request_duration_seconds_count",
        &create,
        21.0,
    );
    let data = [("server", "data")];
    grew(who, a, b, "tessera_client_requests_total", &data, 1.0);
    let two_mib = f64::from(2u32 << 20);
    grew(
        who,
        a,
        b,
        "tessera_client_data_bytes_total",
        &[("direction", "written")],
        two_mib,
    );
    grew(
        who,
        a,
        b,
        "tessera_client_data_bytes_total",
        &[("direction", "read")],
        two_mib,
    );
    grew(who, a, b, "process_cpu_seconds_total", &[], 1e-9);
    assert!(b.sum("process_resident_memory_bytes") > 0.0);
}

fn check_meta(a: &Scrape, b: &Scrape) {
    let who = "meta";
    typed(
        b,
        who,
        &[
            ("tessera_server_requests_total", "counter"),
            ("tessera_server_request_errors_total", "counter"),
            ("tessera_server_request_duration_seconds", "histogram"),
            ("tessera_meta_commits_total", "counter"),
            ("tessera_meta_commit_groups_total", "counter"),
            ("tessera_meta_commit_group_size", "histogram"),
            ("tessera_meta_commit_duration_seconds", "histogram"),
        ],
    );
    for g in [
        "tessera_meta_open_sessions",
        "tessera_meta_open_files",
        "tessera_meta_locks_held",
        "tessera_data_servers",
        "tessera_chain_members",
        "tessera_under_replicated_chunks",
        "tessera_chunks",
        "tessera_connections",
        "process_resident_memory_bytes",
    ] {
        typed(b, who, &[(g, "gauge")]);
    }
    let create = [("server", "meta"), ("request", "create")];
    grew(who, a, b, "tessera_server_requests_total", &create, 21.0);
    grew(
        who,
        a,
        b,
        "tessera_server_request_duration_seconds_count",
        &create,
        21.0,
    );
    grew(who, a, b, "tessera_meta_commits_total", &[], 21.0);
    grew(who, a, b, "tessera_meta_commit_groups_total", &[], 1.0);
    grew(who, a, b, "tessera_meta_commit_group_size_count", &[], 1.0);
    assert!(
        b.sum("tessera_meta_open_sessions") >= 1.0,
        "the held file's session"
    );
    assert_eq!(
        b.value("tessera_data_servers", &[("state", "up")]),
        Some(2.0)
    );
    assert!(
        b.value("tessera_chain_members", &[("state", "serving")])
            .unwrap()
            >= 2.0
    );
    // Read from the status walk, at most every `STATUS_REFRESH`: present, not fresh.
    assert!(b.value("tessera_under_replicated_chunks", &[]).is_some());
    // Both data servers and the mount hold connections, under their own keys.
    assert!(
        b.value("tessera_connections", &[("peer", "server")])
            .unwrap()
            >= 2.0
    );
    assert!(
        b.value("tessera_connections", &[("peer", "client")])
            .unwrap()
            >= 1.0
    );
}

fn check_data(who: &str, a: &Scrape, b: &Scrape) {
    typed(
        b,
        who,
        &[
            ("tessera_server_requests_total", "counter"),
            ("tessera_server_request_duration_seconds", "histogram"),
            ("tessera_data_bytes_total", "counter"),
            ("tessera_data_checksum_failures_total", "counter"),
            ("tessera_data_used_bytes", "gauge"),
            ("tessera_data_capacity_bytes", "gauge"),
            ("tessera_data_chunk_files", "gauge"),
            ("tessera_connections", "gauge"),
            ("process_cpu_seconds_total", "counter"),
        ],
    );
    grew(
        who,
        a,
        b,
        "tessera_server_requests_total",
        &[("server", "data")],
        1.0,
    );
    assert!(
        b.sum("tessera_data_used_bytes") >= f64::from(2u32 << 20),
        "{who} holds the file"
    );
    assert_eq!(b.sum("tessera_data_checksum_failures_total"), 0.0);
    assert!(b.sum_where("tessera_connections", &[("peer", "server")]) >= 1.0);
}

/// `tessera top --once --json`: one entry per endpoint, each of the right role, and the
/// traffic of its interval visible on the mount and on the metadata server.
fn check_top(out: &std::process::Output, addrs: &[String]) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tessera top: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let eps = v["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), addrs.len());
    for (e, (addr, role)) in eps
        .iter()
        .zip(addrs.iter().zip(["mount", "meta", "data", "data"]))
    {
        assert_eq!(e["endpoint"], addr.as_str());
        assert_eq!(e["role"], role, "{e}");
        assert!(e["error"].is_null(), "{e}");
    }
    let (mount, meta) = (&eps[0], &eps[1]);
    assert!(
        mount["total_ops_per_second"].as_f64().unwrap() > 0.0,
        "{mount}"
    );
    assert!(
        mount["ops_per_second"]["create"].as_f64().unwrap() > 0.0,
        "{mount}"
    );
    assert!(
        mount["written_bytes_per_second"].as_f64().unwrap() > 0.0,
        "{mount}"
    );
    let p99 = mount["latency_seconds"]["p99"].as_f64().unwrap();
    let p50 = mount["latency_seconds"]["p50"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 <= p99, "{mount}");
    assert!(
        meta["ops_per_second"]["create"].as_f64().unwrap() > 0.0,
        "{meta}"
    );
    let data_ops: f64 = eps[2..]
        .iter()
        .map(|e| e["total_ops_per_second"].as_f64().unwrap())
        .sum();
    assert!(data_ops > 0.0, "the data servers' load");
}

/// Guards against a panel of the Grafana dashboard naming a metric no process serves.
fn check_dashboard(scrapes: &[Scrape]) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/grafana/tessera-dashboard.json"
    );
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    let mut named = 0;
    for panel in v["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let words = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            for w in words.filter(|w| w.starts_with("tessera_") || w.starts_with("process_")) {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| {
                        w.strip_suffix(s)
                            .filter(|f| scrapes.iter().any(|x| x.kind(f) == Some("histogram")))
                    })
                    .unwrap_or(w);
                assert!(
                    scrapes.iter().any(|s| s.kind(family).is_some()),
                    "{} names {w}",
                    panel["title"]
                );
                named += 1;
            }
        }
    }
    assert!(named >= 20, "the dashboard names {named} metrics");
}

fn check_status_json(cluster: &ProcessCluster) {
    let (code, out) = cluster.tessera(&["status", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["map"]["nodes"].as_array().unwrap().len(), 2, "{v}");
    // 20 small files and two of 2 MiB, in 4 MiB chunks; the second copies may still
    // be syncing in a cluster this young.
    assert!(v["chunks"].as_u64().unwrap() >= 22, "{v}");
    assert!(v["under_replicated_chunks"].is_u64(), "{v}");
}
