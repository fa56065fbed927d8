//! The ring over an adversarial device (see `adversary/mod.rs`): it never
//! panics, never hands an operation back twice, and never releases a
//! buffer the device still holds, whatever the device does within (and a
//! little beyond) the backend contract.

mod adversary;

use adversary::awaited::AwaitedAdversary;
use adversary::fixed::FixedAdversary;
use adversary::{decode, Adversary};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500),
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_ring_survives_an_adversarial_device(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        Adversary::run(&decode(&bytes));
    }

    #[test]
    fn the_awaited_ring_survives_an_adversarial_device(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        AwaitedAdversary::run(&decode(&bytes));
    }

    #[test]
    fn the_fixed_ring_survives_an_adversarial_device(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        FixedAdversary::run(&decode(&bytes));
    }
}

/// Scenarios from a fixed seed exercise every misbehaviour; this asserts
/// they really do.
#[test]
fn adversarial_scenarios_cover_every_misbehaviour() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(any::<u8>(), 100..400);
    let (mut partial, mut overclaims, mut forged, mut repeated, mut held) = (0, 0, 0, 0, 0);
    let (mut returned, mut buried) = (0, 0);
    for _ in 0..100 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let a = Adversary::run(&decode(&bytes));
        partial += a.device.partial_posts;
        overclaims += a.device.overclaims;
        forged += a.device.forged;
        repeated += a.device.repeated;
        held += a.device.held;
        returned += a.returned_ops;
        buried += a.buried();
    }
    println!(
        "partial posts {partial} overclaims {overclaims} forged {forged} repeated {repeated} \
         held {held} ops back {returned} buffers checked {buried}"
    );
    assert!(partial > 0 && overclaims > 0 && forged > 0 && repeated > 0 && held > 0);
    assert!(returned > 1000 && buried >= returned);
}

/// The same for the fixed ring: its scenarios post in part, overclaim,
/// forge, fail operations and queue pairs, fill, fail and replace the
/// shared receive queue's receives and queue pair, and hand slots back
/// that are then checked.
#[test]
fn fixed_ring_scenarios_cover_every_misbehaviour() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(any::<u8>(), 100..400);
    let (mut partial, mut overclaims, mut forged, mut failed) = (0, 0, 0, 0);
    let (mut reattached, mut reattached_late, mut fatal) = (0, 0, 0);
    let (mut returned, mut buried) = (0, 0);
    let (mut srq_sends, mut srq_filled, mut srq_replaced, mut srq_failed) = (0, 0, 0, 0);
    let (mut refill_returned, mut batched, mut batch_refused) = (0, 0, 0);
    for _ in 0..100 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let a = FixedAdversary::run(&decode(&bytes));
        srq_sends += a.device.srq_sends;
        srq_filled += a.srq_filled;
        srq_replaced += a.srq_replaced;
        srq_failed += a.srq_failed;
        refill_returned += a.refill_returned;
        batched += a.batched;
        batch_refused += a.batch_refused;
        fatal += a.fatal;
        partial += a.device.partial_posts;
        overclaims += a.device.overclaims;
        forged += a.device.forged;
        failed += a.failed_ops;
        reattached += a.reattached;
        reattached_late += a.reattached_late;
        returned += a.returned_ops;
        buried += a.buried();
    }
    println!(
        "partial posts {partial} overclaims {overclaims} forged {forged} failed {failed} \
         re-attached {reattached} queue pairs failed {fatal} ops back {returned} \
         slots checked {buried}; shared queue: peer sends {srq_sends} receives filled \
         {srq_filled} queue pairs replaced {srq_replaced} failed {srq_failed} refill \
         receives back {refill_returned}; pushed in batches {batched} (refused there \
         {batch_refused})"
    );
    assert!(
        batched > 0 && batch_refused > 0,
        "batches of several, with refusals"
    );
    assert!(srq_filled > 0 && srq_replaced > 0 && srq_failed > 0 && refill_returned > 0);
    assert!(partial > 0 && overclaims > 0 && forged > 0 && failed > 0 && fatal > 0);
    assert!(reattached > reattached_late, "no detach drained in time");
    assert!(returned > 1000 && buried >= returned);
}

#[test]
fn the_fixed_ring_ignores_a_replayed_completion_after_reattach() {
    adversary::fixed::replayed_completion_after_reattach();
}

#[test]
fn forged_shared_receive_completions_release_nothing() {
    adversary::fixed::forged_shared_receive_completions_release_nothing();
}

#[test]
fn a_partly_refused_shared_post_hands_the_rest_back() {
    adversary::fixed::a_partly_refused_shared_post_hands_the_rest_back();
}

#[test]
fn what_a_timed_out_detach_never_posted_comes_back() {
    adversary::fixed::what_a_timed_out_detach_never_posted_comes_back();
}

#[test]
fn the_last_receive_of_a_detached_queue_pair_comes_back_on_its_event() {
    adversary::fixed::the_last_receive_of_a_detached_queue_pair_comes_back_on_its_event();
}

#[test]
fn a_refused_refill_post_stops_the_refill() {
    adversary::fixed::a_refused_refill_post_stops_the_refill();
}

#[test]
fn refused_refill_posts_under_the_awaited_ring() {
    adversary::fixed::refused_refill_posts_under_the_awaited_ring();
}

#[test]
fn a_refill_stopped_with_nothing_outstanding_wakes_its_waiters() {
    adversary::fixed::a_refill_stopped_with_nothing_outstanding_wakes_its_waiters();
}

#[test]
fn dropping_one_of_two_awaits_in_a_task_keeps_the_others_wake_up() {
    adversary::fixed::dropping_one_of_two_awaits_in_a_task_keeps_the_others_wake_up();
}

/// The same for the awaited ring: its scenarios refuse posts (so futures
/// resolve at once), complete, fail and flush operations, and drop
/// futures unawaited.
#[test]
fn awaited_scenarios_cover_refusals_completions_and_drops() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(any::<u8>(), 100..400);
    let (mut partial, mut overclaims, mut refused, mut resolved, mut dropped) = (0, 0, 0, 0, 0);
    let mut written = 0;
    for _ in 0..100 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let a = AwaitedAdversary::run(&decode(&bytes));
        partial += a.device.partial_posts;
        overclaims += a.device.overclaims;
        refused += a.refused_at_once;
        resolved += a.resolved;
        dropped += a.dropped;
        written += a.written_ok;
    }
    println!(
        "partial posts {partial} overclaims {overclaims} refused at once {refused} \
         resolved {resolved} dropped {dropped} written by the device {written}"
    );
    assert!(partial > 0 && overclaims > 0 && refused > 0 && dropped > 0 && written > 0);
    assert!(resolved > 1000);
}
