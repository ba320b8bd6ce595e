//! The three configuration files as their binaries load them: parse, then validate.
//! The first byte picks the binary (metadata server, data server, client).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let _ = match which % 3 {
        0 => toml::from_str::<meta_server::server::MetaConfig>(text)
            .map_err(|e| e.to_string())
            .and_then(|c| c.validate()),
        1 => toml::from_str::<data_server::DataConfig>(text)
            .map_err(|e| e.to_string())
            .and_then(|c| c.validate()),
        _ => toml::from_str::<fs_client::ClientConfig>(text)
            .map_err(|e| e.to_string())
            .and_then(|c| c.validate()),
    };
});
