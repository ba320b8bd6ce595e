//! Whether what several clients saw of one namespace, calling at once, equals one serial
//! order of their calls (linearizability): each call takes effect at one moment between
//! its start and its answer, in an order that gives every call the answer it got and
//! leaves the names that are there at the end.
//!
//! The model is a set of file names, each naming the token its create wrote: an
//! exclusive create, a rename (over the target when it exists) and an unlink. The search
//! walks the orders that real time allows (a call that was answered before another began
//! goes first), depth first, and remembers the (positions, names) pairs it has seen, so
//! that the calls that did not overlap in time cost one step each.

use std::collections::{BTreeMap, HashSet};

/// Calls of the longest order found that an error shows.
const SHOWN: usize = 12;

/// The names of the model: each file name and the token its create wrote.
pub type Names = BTreeMap<String, u64>;

/// One change of the namespace, as a client asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// An exclusive create of a name, writing a token of its own.
    Create {
        /// The name.
        name: String,
        /// What the new file holds.
        token: u64,
    },
    /// A rename (never to the same name), replacing the target when it exists.
    Rename {
        /// The name renamed.
        from: String,
        /// Its new name.
        to: String,
    },
    /// A name removed.
    Unlink {
        /// The name.
        name: String,
    },
}

/// A call's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Success.
    Done,
    /// EEXIST.
    Exists,
    /// ENOENT.
    Missing,
}

/// One answered call: what was asked, what came back, and when (nanoseconds from one
/// origin shared by all clients).
#[derive(Clone, Debug)]
pub struct Call {
    /// What was asked.
    pub change: Change,
    /// What came back.
    pub answer: Answer,
    /// When it was asked.
    pub start: u64,
    /// When it was answered.
    pub end: u64,
}

/// Applies `change` to `names` as a POSIX file system does; the answer it gives.
pub fn apply(names: &mut Names, change: &Change) -> Answer {
    match change {
        Change::Create { name, token } => {
            if names.contains_key(name) {
                return Answer::Exists;
            }
            names.insert(name.clone(), *token);
            Answer::Done
        }
        Change::Rename { from, to } => match names.remove(from) {
            Some(token) => {
                names.insert(to.clone(), token);
                Answer::Done
            }
            None => Answer::Missing,
        },
        Change::Unlink { name } => match names.remove(name) {
            Some(_) => Answer::Done,
            None => Answer::Missing,
        },
    }
}

/// The clients whose next call may take effect next: a call may, unless another
/// client's next call was answered before it began.
fn may_go_next(clients: &[Vec<Call>], at: &[usize]) -> Vec<usize> {
    let next: Vec<(usize, &Call)> = at
        .iter()
        .enumerate()
        .filter_map(|(c, &i)| clients[c].get(i).map(|call| (c, call)))
        .collect();
    next.iter()
        .filter(|(c, call)| {
            next.iter()
                .all(|(d, other)| d == c || other.end >= call.start)
        })
        .map(|(c, _)| *c)
        .collect()
}

/// One order of every client's calls (client, index) that starts from `start`, gives
/// each call its answer, keeps real time, and ends at `end`; or, where there is none,
/// why: how many calls the longest such order reached, and the calls that could not
/// follow it.
pub fn serial_order(
    clients: &[Vec<Call>],
    start: &Names,
    end: &Names,
) -> Result<Vec<(usize, usize)>, String> {
    let total: usize = clients.iter().map(Vec::len).sum();
    let mut seen: HashSet<(Vec<usize>, Names)> = HashSet::new();
    // Each entry: the positions, the names there, and the call that led there. The
    // order so far is shared: `order`, rewound to the entry's depth when the search
    // backs up.
    type Entry = (Vec<usize>, Names, Option<(usize, usize)>);
    let mut stack: Vec<Entry> = vec![(vec![0; clients.len()], start.clone(), None)];
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(total);
    // The longest order found: its length, positions, and last calls (for the error).
    let mut deepest: (usize, Vec<usize>, Vec<(usize, usize)>) =
        (0, vec![0; clients.len()], Vec::new());
    while let Some((at, names, step)) = stack.pop() {
        let depth: usize = at.iter().sum();
        order.truncate(depth.saturating_sub(1));
        order.extend(step);
        if depth == total {
            if &names == end {
                return Ok(order);
            }
            continue;
        }
        if !seen.insert((at.clone(), names.clone())) {
            continue;
        }
        if depth > deepest.0 {
            let last = order[order.len().saturating_sub(SHOWN)..].to_vec();
            deepest = (depth, at.clone(), last);
        }
        for c in may_go_next(clients, &at) {
            let call = &clients[c][at[c]];
            let mut after = names.clone();
            if apply(&mut after, &call.change) == call.answer {
                let mut next = at.clone();
                next[c] += 1;
                stack.push((next, after, Some((c, at[c]))));
            }
        }
    }
    let show = |c: usize, i: usize| format!("client {c} call {i}: {:?}", clients[c][i]);
    let before: Vec<String> = deepest.2.iter().map(|&(c, i)| show(c, i)).collect();
    let stuck: Vec<String> = deepest
        .1
        .iter()
        .enumerate()
        .filter_map(|(c, &i)| {
            clients[c]
                .get(i)
                .map(|call| format!("client {c} call {i}: {call:?}"))
        })
        .collect();
    Err(format!(
        "no serial order of the {total} answered calls gives their answers and the names at the end; \
         the longest order reached {} calls, ending\n  {}\nthen none of\n  {}",
        deepest.0,
        before.join("\n  "),
        stuck.join("\n  ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(name: &str, token: u64) -> Change {
        Change::Create {
            name: name.into(),
            token,
        }
    }

    fn unlink(name: &str) -> Change {
        Change::Unlink { name: name.into() }
    }

    fn call(change: Change, answer: Answer, start: u64, end: u64) -> Call {
        Call {
            change,
            answer,
            start,
            end,
        }
    }

    fn names(pairs: &[(&str, u64)]) -> Names {
        pairs.iter().map(|(n, t)| (n.to_string(), *t)).collect()
    }

    #[test]
    fn the_model_answers_as_posix_does() {
        let mut n = Names::new();
        assert_eq!(apply(&mut n, &create("a", 1)), Answer::Done);
        assert_eq!(apply(&mut n, &create("a", 2)), Answer::Exists);
        assert_eq!(apply(&mut n, &create("b", 3)), Answer::Done);
        let over = Change::Rename {
            from: "a".into(),
            to: "b".into(),
        };
        assert_eq!(apply(&mut n, &over), Answer::Done);
        assert_eq!(n, names(&[("b", 1)]));
        assert_eq!(apply(&mut n, &over), Answer::Missing);
        assert_eq!(apply(&mut n, &unlink("b")), Answer::Done);
        assert_eq!(apply(&mut n, &unlink("b")), Answer::Missing);
        assert!(n.is_empty());
    }

    #[test]
    fn two_overlapping_creates_of_one_name_cannot_both_win() {
        let clients = vec![
            vec![call(create("x", 1), Answer::Done, 0, 10)],
            vec![call(create("x", 2), Answer::Done, 5, 15)],
        ];
        let either = [names(&[("x", 1)]), names(&[("x", 2)])];
        for end in &either {
            let why = serial_order(&clients, &Names::new(), end).unwrap_err();
            assert!(why.contains("reached 1 calls"), "{why}");
        }
    }

    #[test]
    fn overlapping_calls_take_the_order_their_answers_need() {
        // Client 1's unlink, though it began first, took effect after client 0's create.
        let clients = vec![
            vec![call(create("x", 1), Answer::Done, 5, 10)],
            vec![call(unlink("x"), Answer::Done, 0, 20)],
        ];
        assert_eq!(
            serial_order(&clients, &Names::new(), &Names::new()),
            Ok(vec![(0, 0), (1, 0)])
        );
    }

    #[test]
    fn real_time_is_kept_between_calls_that_did_not_overlap() {
        // The unlink was answered before the create began: it cannot have seen it.
        let clients = vec![
            vec![call(create("x", 1), Answer::Done, 30, 40)],
            vec![call(unlink("x"), Answer::Done, 0, 20)],
        ];
        assert!(serial_order(&clients, &Names::new(), &Names::new()).is_err());
    }

    #[test]
    fn the_names_at_the_end_must_be_those_of_some_order() {
        let clients = vec![
            vec![
                call(create("a", 1), Answer::Done, 0, 10),
                call(
                    Change::Rename {
                        from: "a".into(),
                        to: "b".into(),
                    },
                    Answer::Done,
                    20,
                    30,
                ),
            ],
            vec![call(create("b", 2), Answer::Done, 5, 25)],
        ];
        // The create of b came before the rename over it, or after it (then Exists).
        assert!(serial_order(&clients, &Names::new(), &names(&[("b", 1)])).is_ok());
        assert!(serial_order(&clients, &Names::new(), &names(&[("b", 2)])).is_err());
        assert!(serial_order(&clients, &Names::new(), &names(&[("a", 1), ("b", 2)])).is_err());
    }

    #[test]
    fn a_long_history_of_calls_one_after_another_is_checked_in_one_step_each() {
        // 2 clients, 5,000 calls each, alternating in time: linear, not exponential.
        let mut clients = vec![Vec::new(), Vec::new()];
        let mut model = Names::new();
        for i in 0..10_000u64 {
            let c = (i % 2) as usize;
            let change = match i % 3 {
                0 => create("x", i),
                1 => Change::Rename {
                    from: "x".into(),
                    to: "y".into(),
                },
                _ => unlink("y"),
            };
            let answer = apply(&mut model, &change);
            clients[c].push(call(change, answer, i * 10, i * 10 + 5));
        }
        let order = serial_order(&clients, &Names::new(), &model).expect("serial");
        assert_eq!(order.len(), 10_000);
    }
}
