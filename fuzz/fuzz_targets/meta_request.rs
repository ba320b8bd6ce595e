//! A metadata server's view of a peer: any bytes as one request of any subsystem
//! (file system, cluster, admin), as `meta-server` decodes a call's payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::meta::MetaRequest;

fuzz_target!(|data: &[u8]| {
    proto::fuzzing::message::<MetaRequest>(data);
});
