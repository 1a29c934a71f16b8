use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use proptest::prelude::*;

use super::*;

#[test]
fn first_asked_first_served_and_asked_again_keeps_its_place() {
    let mut queue = WorkQueue::default();
    for key in ["a", "b", "c", "a"] {
        queue.ask(key);
    }
    assert_eq!(queue.waiting(), 3);
    assert_eq!(queue.take_turn(), Some("a"));
    // Asked while it runs: not handed out again, but queued behind the others once done.
    queue.ask("a");
    assert_eq!(queue.take_turn(), Some("b"));
    queue.done(&"a");
    assert_eq!(queue.take_turn(), Some("c"));
    assert_eq!(queue.take_turn(), Some("a"));
    assert_eq!(queue.take_turn(), None);
    // Done without being asked for meanwhile: gone.
    queue.done(&"a");
    assert_eq!(queue.take_turn(), None);
}

#[derive(Clone, Debug)]
enum Op {
    Ask(u8),
    Next,
    Done(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..6).prop_map(Op::Ask),
        Just(Op::Next),
        (0usize..4).prop_map(Op::Done),
    ]
}

proptest! {
    /// Whatever is asked and finished in whatever order: no key is handed out while it runs,
    /// and while a key waits no other key is handed out twice (it waits behind each of them at
    /// most once, however often they are asked for).
    #[test]
    fn no_key_runs_twice_at_once_and_none_is_passed_twice(ops in proptest::collection::vec(op(), 1..200)) {
        let mut queue = WorkQueue::default();
        let mut running: Vec<u8> = Vec::new();
        // For each waiting key, the keys handed out since it began waiting.
        let mut passed_by: BTreeMap<u8, BTreeSet<u8>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Ask(key) => {
                    if !running.contains(&key) {
                        passed_by.entry(key).or_default();
                    }
                    queue.ask(key);
                }
                Op::Next => {
                    if let Some(key) = queue.take_turn() {
                        prop_assert!(!running.contains(&key), "{key} handed out while it runs");
                        running.push(key);
                        passed_by.remove(&key);
                        for (waiting, passed) in &mut passed_by {
                            prop_assert!(passed.insert(key), "{key} handed out twice while {waiting} waited");
                        }
                    } else {
                        prop_assert!(passed_by.is_empty(), "nothing handed out while {passed_by:?} wait");
                    }
                }
                Op::Done(i) => {
                    if !running.is_empty() {
                        let key = running.remove(i % running.len());
                        queue.done(&key);
                        // Asked for while it ran: it waits again from now.
                        if queue.order.contains(&key) {
                            passed_by.entry(key).or_default();
                        }
                    }
                }
            }
        }
    }
}

/// What the runner did: turns started per key, the most running at once, and whether a key
/// ever ran twice at once.
#[derive(Default)]
struct Seen {
    order: Vec<&'static str>,
    now: BTreeSet<&'static str>,
    most: usize,
    overlapped: bool,
}

#[tokio::test]
async fn a_key_asked_once_runs_before_a_busy_key_has_run_many_times() {
    const ONCE: [&str; 20] = [
        "k00", "k01", "k02", "k03", "k04", "k05", "k06", "k07", "k08", "k09", "k10", "k11", "k12", "k13",
        "k14", "k15", "k16", "k17", "k18", "k19",
    ];
    let (ask, requests) = futures::channel::mpsc::unbounded::<&'static str>();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let finished = Arc::new(tokio::sync::Notify::new());
    ask.unbounded_send("busy").unwrap();
    for key in ONCE {
        ask.unbounded_send(key).unwrap();
    }
    let runner = run(requests, 2, std::future::ready(()), |key| {
        let (seen, ask, finished) = (seen.clone(), ask.clone(), finished.clone());
        async move {
            {
                let mut seen = seen.lock().unwrap();
                seen.overlapped |= !seen.now.insert(key);
                seen.most = seen.most.max(seen.now.len());
                seen.order.push(key);
            }
            // The busy key is asked for again while it runs, as a busy project's demands do.
            let busy_turns = seen
                .lock()
                .unwrap()
                .order
                .iter()
                .filter(|k| **k == "busy")
                .count();
            if key == "busy" && busy_turns < 100 {
                ask.unbounded_send("busy").unwrap();
            }
            tokio::task::yield_now().await;
            let mut seen = seen.lock().unwrap();
            seen.now.remove(key);
            if busy_turns >= 100 && ONCE.iter().all(|k| seen.order.contains(k)) {
                finished.notify_one();
            }
            Next::AwaitChange
        }
    });
    tokio::select! {
        () = runner => panic!("the runner stopped while its requests were open"),
        () = finished.notified() => {}
    }
    let seen = seen.lock().unwrap();
    assert!(!seen.overlapped, "a key ran twice at once");
    assert!(seen.most <= 2, "{} turns at once", seen.most);
    // Every key asked once ran before the busy one had run twice: it was asked for first, and
    // again only behind all of them.
    let last_once = seen.order.iter().rposition(|k| *k != "busy").unwrap();
    let busy_before = seen.order[..last_once].iter().filter(|k| **k == "busy").count();
    assert!(
        busy_before <= 2,
        "busy ran {busy_before} times before the last key asked once: {:?}",
        seen.order
    );
}

#[tokio::test]
async fn nothing_runs_before_ready_and_a_turn_may_ask_for_another_later() {
    let (ask, requests) = futures::channel::mpsc::unbounded::<&'static str>();
    let (open, ready) = tokio::sync::oneshot::channel::<()>();
    let turns = Arc::new(Mutex::new(Vec::new()));
    ask.unbounded_send("a").unwrap();
    drop(ask);
    let runner = run(requests, 4, async { ready.await.unwrap() }, |key| {
        let turns = turns.clone();
        async move {
            let mut turns = turns.lock().unwrap();
            turns.push(key);
            if turns.len() < 3 {
                Next::After(Duration::from_millis(1))
            } else {
                Next::AwaitChange
            }
        }
    });
    let mut runner = std::pin::pin!(runner);
    // Not ready: the request waits.
    assert!(futures::poll!(runner.as_mut()).is_pending());
    assert!(turns.lock().unwrap().is_empty());
    open.send(()).unwrap();
    // The requests have ended; the runner returns once the turns it asked for later ran.
    runner.await;
    assert_eq!(*turns.lock().unwrap(), ["a", "a", "a"]);
}

#[test]
fn a_key_has_one_retry_time_the_earliest_and_loses_it_when_its_turn_starts() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let mut retries = Retries::default();
    // However often a key's turns ask for another, it is due once, at the earliest time.
    retries.set("a", at(30));
    retries.set("a", at(20));
    retries.set("a", at(50));
    retries.set("b", at(40));
    assert_eq!(retries.next_at(), Some(at(20)));
    assert_eq!(retries.due(at(25)), ["a"]);
    assert!(retries.due(at(25)).is_empty());
    // Its turn started (asked for by a change): the time goes with it.
    retries.set("a", at(60));
    retries.cancel(&"a");
    assert_eq!(retries.due(at(100)), ["b"]);
    assert!(retries.is_empty());
}

#[tokio::test]
async fn the_runner_returns_when_its_requests_end_after_the_last_turn() {
    let (ask, requests) = futures::channel::mpsc::unbounded::<&'static str>();
    let (ran, mut turns) = futures::channel::mpsc::unbounded::<&'static str>();
    ask.unbounded_send("a").unwrap();
    let runner = run(requests, 1, std::future::ready(()), move |key| {
        let ran = ran.clone();
        async move {
            ran.unbounded_send(key).unwrap();
            Next::AwaitChange
        }
    });
    let mut runner = std::pin::pin!(runner);
    // "a" runs and ends while the requests are still open; then they end.
    let first = tokio::select! {
        () = runner.as_mut() => panic!("returned while its requests were open"),
        key = turns.next() => key,
    };
    assert_eq!(first, Some("a"));
    drop(ask);
    tokio::time::timeout(Duration::from_secs(10), runner)
        .await
        .expect("the runner returns once its requests have ended and nothing runs");
}
