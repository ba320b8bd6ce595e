//! A client's view of a server: any bytes as the answer (`Result<Reply, WireError>`) to
//! any request of any subsystem. The first byte picks the subsystem, the second the
//! request type within it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::data::DataRequest;
use proto::meta::{admin::AdminRequest, cluster::ClusterRequest, fs::FsRequest};

fuzz_target!(|data: &[u8]| {
    let [subsystem, which, rest @ ..] = data else {
        return;
    };
    let which = usize::from(*which);
    match subsystem % 4 {
        0 => FsRequest::fuzz_reply(which, rest),
        1 => ClusterRequest::fuzz_reply(which, rest),
        2 => AdminRequest::fuzz_reply(which, rest),
        _ => DataRequest::fuzz_reply(which, rest),
    };
});
