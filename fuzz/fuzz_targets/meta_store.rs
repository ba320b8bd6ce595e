//! A metadata server's store and log, damaged or hostile: the first byte picks a stored
//! record type of the namespace, or (255) a metadata log record's body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meta_server::fuzzing;

fuzz_target!(|data: &[u8]| {
    match data {
        [255, rest @ ..] => fuzzing::log_record(rest),
        [kind, rest @ ..] => fuzzing::namespace_record(*kind, rest),
        [] => {}
    }
});
