//! A data server's view of a peer: any bytes as one chunk request, as `data-server`
//! decodes a call's payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::data::DataRequest;

fuzz_target!(|data: &[u8]| {
    proto::fuzzing::message::<DataRequest>(data);
});
