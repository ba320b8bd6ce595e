//! The cluster check that `scripts/rdma-vm-cluster.sh` runs over rdma in the soft-RoCE
//! VM, run here over tcp with a smaller file so that the default suite keeps it working.

use tessera_tests::cluster_check::{run, CheckOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_check_over_tcp_reads_the_same_bytes_through_a_data_server_kill() {
    let report = run(CheckOptions {
        transport: "tcp".into(),
        host: "127.0.0.1".into(),
        size_bytes: 64 << 20,
        bin_dir: None,
        victim: 1,
        seed: 5,
    })
    .await
    .expect("the cluster check passes");
    assert!(report.retries > 0, "{report:?}");
}
