//! A data server's disk, damaged or hostile: the first byte picks a format (chunk file
//! header with its replica fields and checksum table, saved node id, saved usage, chunk
//! file name), the rest is the file's bytes.
#![no_main]

use data_server::store::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else {
        return;
    };
    match which % 4 {
        0 => fuzzing::chunk_file(rest),
        1 => fuzzing::node_id(rest),
        2 => fuzzing::saved_usage(rest),
        _ => {
            if let Ok(name) = std::str::from_utf8(rest) {
                fuzzing::chunk_name(name);
            }
        }
    }
});
