use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn t0() -> Instant {
    static T0: OnceLock<Instant> = OnceLock::new();
    *T0.get_or_init(Instant::now)
}

fn later(secs: u64) -> Instant {
    t0() + Duration::from_secs(secs)
}

fn fp(name: &str) -> Fingerprint {
    Fingerprint::of(&json!(name))
}

/// A copy as the API server would show it: UID `uid`, at `generation`, with label `team`.
fn sighting(uid: &str, generation: i64, team: &str) -> Sighting {
    Sighting::of(&ObjectMeta {
        uid: Some(uid.to_owned()),
        generation: Some(generation),
        labels: Some([("team".to_owned(), team.to_owned())].into()),
        ..ObjectMeta::default()
    })
}

/// The copy `seed`/`name` applied, answered as UID `u1` at `generation`, label `red`.
fn written(copies: &KkpCopies, seed: &str, name: &str, generation: i64) -> Option<Retake> {
    copies
        .applying(seed, name)
        .landed(fp(name), sighting("u1", generation, "red"), fp("status"), t0())
}

fn seen(copies: &KkpCopies, generation: i64, at: Instant) -> Option<Retake> {
    copies.seen("a", "q", sighting("u1", generation, "red"), None, at)
}

#[test]
fn a_copy_seen_by_the_watch_past_its_own_generation_is_written_again_once() {
    let copies = KkpCopies::default();
    assert_eq!(written(&copies, "a", "q", 3), None);
    assert_eq!(seen(&copies, 3, t0()), None, "its own generation");
    assert_eq!(seen(&copies, 2, t0()), None, "an event from before the apply");
    let other_seed = copies.seen("b", "q", sighting("u1", 9, "red"), None, t0());
    assert_eq!(other_seed, None, "never written on that seed");
    assert_eq!(seen(&copies, 4, t0()), Some(Retake::Now), "edited by hand");
    assert!(copies.get("a", "q").applied.is_none());
    assert_eq!(seen(&copies, 5, t0()), None, "already due");
}

#[test]
fn a_copy_recreated_or_relabelled_without_a_new_generation_is_written_again() {
    let copies = KkpCopies::default();
    written(&copies, "a", "q", 1);
    let relabelled = copies.seen("a", "q", sighting("u1", 1, "blue"), None, t0());
    assert_eq!(relabelled, Some(Retake::Now));
    written(&copies, "a", "q", 1);
    let start = copies.list_starts();
    let recreated = copies.seen("a", "q", sighting("u2", 1, "red"), Some(start), later(1));
    assert_eq!(
        recreated,
        Some(Retake::Now),
        "another object of the name, in a list"
    );
}

#[test]
fn what_is_seen_while_an_apply_is_under_way_is_judged_by_its_answer() {
    let copies = KkpCopies::default();
    written(&copies, "a", "q", 3);
    // The apply's own event, before its answer: nothing.
    let apply = copies.applying("a", "q");
    assert_eq!(seen(&copies, 4, t0()), None);
    assert_eq!(
        apply.landed(fp("q"), sighting("u1", 4, "red"), fp("s"), t0()),
        None
    );
    assert!(copies.get("a", "q").applied.is_some());
    // An edit right after the apply, seen before its answer: applied again.
    let apply = copies.applying("a", "q");
    assert_eq!(seen(&copies, 5, t0()), None, "judged by the answer");
    let again = apply.landed(fp("q"), sighting("u1", 4, "red"), fp("s"), later(1));
    assert_eq!(again, Some(Retake::Now));
    assert!(copies.get("a", "q").applied.is_none());
    // A deletion seen while the apply was under way: applied again too.
    written(&copies, "a", "q", 6);
    let apply = copies.applying("a", "q");
    assert!(!copies.deleted("a", "q"), "the answer decides");
    let again = apply.landed(fp("q"), sighting("u1", 6, "red"), fp("s"), later(200));
    assert_eq!(again, Some(Retake::Now));
    // An apply that failed or was dropped leaves the copy unknown, and no apply under way.
    written(&copies, "a", "q", 7);
    drop(copies.applying("a", "q"));
    assert!(copies.get("a", "q").applied.is_none());
    assert!(!copies.get("a", "q").applying);
}

#[test]
fn a_copy_another_writer_keeps_changing_is_taken_back_a_few_times_a_minute() {
    let copies = KkpCopies::default();
    // A person's few edits in a row: each taken back at once.
    for n in 0..i64::from(RETAKES_PER_PAUSE) {
        written(&copies, "a", "q", 2 * n + 1);
        assert_eq!(
            seen(&copies, 2 * n + 2, later(n.unsigned_abs())),
            Some(Retake::Now)
        );
    }
    written(&copies, "a", "q", 11);
    // One more within the minute: left as it is until the minute is over, asked for once.
    let at = Some(Retake::At(t0() + RETAKE_PAUSE));
    assert_eq!(seen(&copies, 12, later(5)), at);
    assert!(copies.get("a", "q").applied.is_some(), "not rewritten meanwhile");
    assert_eq!(seen(&copies, 13, later(6)), None, "a retake waits already");
    assert_eq!(
        copies.retake_waits_until("a", "q"),
        Some(t0() + RETAKE_PAUSE),
        "asked for by every reconcile until it is due"
    );
    assert!(
        !copies.take_back_due("a", "q", later(30)),
        "the minute is not over"
    );
    assert!(copies.take_back_due("a", "q", t0() + RETAKE_PAUSE));
    assert!(copies.get("a", "q").applied.is_none());
    assert_eq!(copies.retake_waits_until("a", "q"), None, "taken");
    assert!(!copies.take_back_due("a", "q", later(90)), "taken once");
    // The same writer racing the apply itself counts too: two more at once, then a pause.
    for n in 0..2 {
        let apply = copies.applying("a", "q");
        assert_eq!(seen(&copies, 21 + 2 * n, later(61)), None);
        let again = apply.landed(fp("q"), sighting("u1", 20 + 2 * n, "red"), fp("s"), later(61));
        assert_eq!(again, Some(Retake::Now));
    }
    let apply = copies.applying("a", "q");
    assert_eq!(seen(&copies, 31, later(62)), None);
    let again = apply.landed(fp("q"), sighting("u1", 30, "red"), fp("s"), later(62));
    assert_eq!(again, Some(Retake::At(t0() + RETAKE_PAUSE + RETAKE_PAUSE)));
    // A list (the watch restarted, a restore) is answered at once.
    let start = copies.list_starts();
    let listed = copies.seen("a", "q", sighting("u1", 2, "red"), Some(start), later(63));
    assert_eq!(listed, Some(Retake::Now));
}

#[test]
fn a_list_judges_only_what_was_applied_before_it_began() {
    let copies = KkpCopies::default();
    written(&copies, "a", "q", 6);
    let start = copies.list_starts();
    written(&copies, "a", "late", 1);
    let list =
        |name: &str, generation| copies.seen("a", name, sighting("u1", generation, "red"), Some(start), t0());
    assert_eq!(list("q", 6), None);
    assert_eq!(list("late", 7), None, "applied after the list began");
    assert_eq!(list("q", 2), Some(Retake::Now), "restored from an older backup");
    assert_eq!(
        copies.listed("a", start, &BTreeSet::new()),
        Vec::<String>::new(),
        "q is due already, late is newer"
    );
}

#[test]
fn a_copy_deleted_or_not_listed_is_forgotten() {
    let copies = KkpCopies::default();
    for name in ["q1", "q2", "q3"] {
        written(&copies, "a", name, 1);
        written(&copies, "b", name, 1);
    }
    assert!(copies.deleted("a", "q1"));
    assert!(!copies.deleted("a", "q1"), "already forgotten");
    assert!(copies.get("a", "q1").applied.is_none());
    let start = copies.list_starts();
    let listed: BTreeSet<String> = ["q3".to_owned(), "unknown".to_owned()].into();
    assert_eq!(copies.listed("a", start, &listed), vec!["q2".to_owned()]);
    assert!(copies.get("a", "q3").applied.is_some());
    assert!(
        copies.get("b", "q2").applied.is_some(),
        "another seed's copies stay"
    );
    copies.forget_seed("b");
    assert!(copies.get("b", "q3").applied.is_none());
}
