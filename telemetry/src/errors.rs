//! A program's last words: an error and its causes as one line on stderr.

/// An error and its causes as one line, each cause once: most errors here show their
/// source in their own message too, so printing every link of the chain would say each
/// cause two or three times ("cannot connect to A: refused: cannot connect to A:
/// refused: refused"). A cause that an earlier part already says is left out.
pub fn each_cause_once(causes: impl IntoIterator<Item = String>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in causes {
        if !c.is_empty() && !parts.iter().any(|p| p.contains(&c)) {
            parts.push(c);
        }
    }
    parts.join(": ")
}

/// [`each_cause_once`] of an error's chain of sources.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let causes = std::iter::successors(Some(e), |e| e.source()).map(|c| c.to_string());
    each_cause_once(causes)
}

#[cfg(test)]
mod tests {
    use super::{each_cause_once, one_line};

    #[test]
    fn each_cause_is_said_once() {
        let chain = [
            "connecting to the metadata server at 127.0.0.1:9",
            "cannot connect to 127.0.0.1:9: Connection refused (os error 111)",
            "cannot connect to 127.0.0.1:9: Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]
        .map(String::from);
        assert_eq!(
            each_cause_once(chain),
            "connecting to the metadata server at 127.0.0.1:9: cannot connect to \
             127.0.0.1:9: Connection refused (os error 111)"
        );
        let distinct = ["reading x", "permission denied"].map(String::from);
        assert_eq!(each_cause_once(distinct), "reading x: permission denied");
    }

    #[test]
    fn a_chain_of_sources_is_one_line() {
        let io = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let outer = std::io::Error::other(io);
        assert_eq!(one_line(&outer), "address in use");
    }
}
