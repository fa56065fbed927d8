//! The ring and the soft device against a reference model: a server ring
//! with several queue pairs on one completion queue (and, in half the
//! scenarios, a shared receive queue) against a client ring per queue
//! pair; random sequences of push, submit, progress, poll, fault
//! injection, broken links, fatal events, detach and reattach, and closes
//! with work in flight (see `model/mod.rs` for what is checked after every
//! step).

mod model;

use model::{decode, Model};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn ring_matches_model(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        Model::run(&decode(&bytes));
    }
}

/// Scenarios from a fixed seed cover every op kind, selective signaling,
/// full queues, injected errors with flush, and closes with work in flight;
/// this asserts they really do, so the model test cannot quietly test less.
#[test]
fn random_scenarios_cover_everything() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(any::<u8>(), 200..600);
    let (mut pushed, mut completed, mut kinds_ok) = (0, 0, [0usize; 8]);
    let (mut full, mut flushed, mut failed, mut closed_in_flight) = (0, 0, 0, 0);
    let (mut cq_full, mut detached, mut srq_received, mut fatal) = (0, 0, 0, 0);
    let mut reattached = 0;
    for _ in 0..300 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let m = Model::run(&decode(&bytes));
        pushed += m.pushed;
        completed += m.completed;
        for (total, n) in kinds_ok.iter_mut().zip(m.kinds_ok) {
            *total += n;
        }
        full += m.refused_full;
        flushed += m.flushed;
        failed += m.failed;
        closed_in_flight += m.closed_in_flight;
        cq_full += m.refused_cq;
        detached += m.detached_in_flight;
        srq_received += m.srq_received;
        fatal += m.fatal;
        reattached += m.reattached;
    }
    println!(
        "pushed {pushed} completed {completed} ok by kind {kinds_ok:?} full {full} \
         flushed {flushed} failed {failed} closed in flight {closed_in_flight} \
         shared CQ full {cq_full} detached in flight {detached} shared receives \
         {srq_received} fatal events {fatal} re-attached {reattached}"
    );
    assert_eq!(pushed, completed, "every pushed op came back");
    assert!(
        kinds_ok.iter().all(|&n| n > 0),
        "every op kind succeeded somewhere: {kinds_ok:?}"
    );
    assert!(full > 0, "a full queue was hit");
    assert!(flushed > 0, "flushes happened");
    assert!(failed > 0, "errors happened");
    assert!(closed_in_flight > 0, "a ring closed with work in flight");
    assert!(cq_full > 0, "the shared completion queue filled");
    assert!(
        detached > 0,
        "a queue pair was detached with work in flight"
    );
    assert!(srq_received > 0, "shared receives were consumed");
    assert!(fatal > 0, "fatal queue pair events were raised");
    assert!(reattached > 0, "detached queue pairs were attached again");
}
