//! Sessions on the soft device: every lab step, limits, leases and
//! timeouts, ownership moving both ways, windows, and hostile peers.

use std::alloc::Layout;
use std::sync::Arc;
use std::time::Duration;

use rdma_ring::backend::soft::{SoftDevice, SoftQp};
use rdma_ring::backend::{AsyncEvent, QpConfig};
use rdma_ring::buf::{BaseBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
use rdma_ring::op::{Recv, Send};
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::session::wire::{Control, Kind, Message, RegionDescriptor, Trailer};
use rdma_ring::session::{Hello, RefuseReason, Session, SessionConfig, SessionError, SessionHost};
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(10);

fn pair(config: SessionConfig) -> (Session<SoftQp>, Session<SoftQp>) {
    SessionHost::soft_pair(&SoftDevice::new(), config).unwrap()
}

fn bytes(n: usize) -> Layout {
    Layout::from_size_align(n, 8).unwrap()
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    timeout(PATIENCE, f).await.expect("no answer in time")
}

#[tokio::test]
async fn lab_1_send_and_receive() {
    let (client, server) = pair(SessionConfig::default());
    let mut msg = client.alloc_local_mr(bytes(11)).unwrap();
    msg.copy_from_slice(b"hello world");
    let (sent, msg) = within(client.send(msg.slice(..))).await;
    sent.unwrap();
    assert_eq!(&msg[..], b"hello world", "the buffer comes back");
    let got = within(server.receive()).await.unwrap();
    assert_eq!(&got[..], b"hello world");
    // A part of a region, the other way.
    let mut reply = server.alloc_local_mr(bytes(100)).unwrap();
    reply[..4].copy_from_slice(b"pong");
    within(server.send(reply.slice(..4))).await.0.unwrap();
    assert_eq!(&within(client.receive()).await.unwrap()[..], b"pong");
}

#[tokio::test]
async fn lab_2_send_and_receive_with_immediate() {
    let (client, server) = pair(SessionConfig::default());
    let mut msg = client.alloc_local_mr(bytes(5)).unwrap();
    msg.copy_from_slice(b"12345");
    let (sent, msg) = within(client.send_with_imm(msg.slice(..), 0xfeed)).await;
    sent.unwrap();
    within(client.send(msg.into_inner().slice(1..3)))
        .await
        .0
        .unwrap();
    let (got, imm) = within(server.receive_with_imm()).await.unwrap();
    assert_eq!((&got[..], imm), (&b"12345"[..], Some(0xfeed)));
    let (got, imm) = within(server.receive_with_imm()).await.unwrap();
    assert_eq!((&got[..], imm), (&b"23"[..], None));
}

#[tokio::test]
async fn lab_3_the_server_reads_a_region_the_client_sent() {
    let (client, server) = pair(SessionConfig::default());
    let mut region = client.alloc_local_mr(bytes(4096)).unwrap();
    for (i, b) in region.iter_mut().enumerate() {
        *b = i as u8;
    }
    client.send_local_mr(region, RemoteAccess::READ).unwrap();
    // `region` moved: the client cannot touch it while the server holds it.

    let remote = within(server.receive_remote_mr()).await.unwrap();
    assert_eq!((remote.len(), remote.rights()), (4096, RemoteAccess::READ));
    let into = server.alloc_local_mr_zeroed(bytes(4096)).unwrap();
    let (read, into) = within(server.read(into, remote.remote())).await;
    assert_eq!(read.unwrap(), 4096);
    assert!(into.iter().enumerate().all(|(i, &b)| b == i as u8));
    // A write needs a right the client did not grant: refused at push.
    let (denied, _) = within(server.write(into, remote.remote())).await;
    assert!(denied.is_err());
    server.send_remote_mr(remote).unwrap();

    let back = within(client.receive_local_mr()).await.unwrap();
    assert_eq!(back.len(), 4096);
    assert!(back.iter().enumerate().all(|(i, &b)| b == i as u8));
}

/// A message that lets the peer free memory — a region returned or
/// released, the close — asks for a fence, so that the READs before it
/// finish first (a READ whose response was lost runs again at the
/// responder); other messages do not.
#[tokio::test]
async fn messages_that_let_the_peer_free_memory_wait_for_our_reads() {
    let (client, server) = pair(SessionConfig::default());
    let (ours, theirs) = (
        server.with_queue_pair(|qp| qp.control()).unwrap(),
        client.with_queue_pair(|qp| qp.control()).unwrap(),
    );
    let region = client.alloc_local_mr(bytes(64)).unwrap();
    client.send_local_mr(region, RemoteAccess::READ).unwrap();
    let remote = within(server.receive_remote_mr()).await.unwrap();
    let into = server.alloc_local_mr_zeroed(bytes(64)).unwrap();
    let (read, into) = within(server.read(into, remote.remote())).await;
    assert_eq!(read.unwrap(), 64);
    within(server.send(into.slice(..8))).await.0.unwrap();
    within(client.receive()).await.unwrap();
    assert_eq!(ours.counters().fenced, 0, "nothing let go yet");
    server.send_remote_mr(remote).unwrap();
    within(client.receive_local_mr()).await.unwrap();
    assert_eq!(ours.counters().fenced, 1, "the return");

    let requested = within(server.request_remote_mr(bytes(8))).await.unwrap();
    drop(requested);
    within(async {
        while ours.counters().fenced < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    })
    .await;
    assert_eq!(ours.counters().fenced, 2, "the release");
    assert_eq!(theirs.counters().fenced, 0, "the grant and the rest");
    // (The close is fenced as well; its queue pair, and so its counters,
    // are gone once it went.)
}

#[tokio::test]
async fn lab_4_the_client_writes_a_region_it_requested() {
    let (client, server) = pair(SessionConfig::default());
    let mut local = client.alloc_local_mr(bytes(8)).unwrap();
    local.copy_from_slice(&[1u8; 8]);
    let remote = within(client.request_remote_mr(bytes(8))).await.unwrap();
    assert_eq!(remote.rights(), RemoteAccess::READ | RemoteAccess::WRITE);
    let (written, _local) = within(client.write(local, remote.remote())).await;
    assert_eq!(written.unwrap(), 8);
    client.send_remote_mr(remote).unwrap();
    let region = within(server.receive_local_mr()).await.unwrap();
    assert_eq!(*region, [1u8; 8]);
}

#[tokio::test]
async fn lab_5_write_with_immediate() {
    let (client, server) = pair(SessionConfig::default());
    let remote = within(client.request_remote_mr(bytes(64))).await.unwrap();
    let mut local = client.alloc_local_mr(bytes(64)).unwrap();
    local.fill(0xab);
    let (written, _) = within(client.write_with_imm(local, remote.remote(), 42)).await;
    assert_eq!(written.unwrap(), 64);
    assert_eq!(within(server.receive_write_imm()).await.unwrap(), 42);
    client.send_remote_mr(remote).unwrap();
    let region = within(server.receive_local_mr()).await.unwrap();
    assert!(region.iter().all(|&b| b == 0xab));
}

/// A host holds `max_sessions` sessions at most, each with room in the
/// completion queue for its full queues: one more handshake is refused
/// (and costs the other side nothing), and a session that ends makes room.
#[tokio::test]
async fn a_host_refuses_sessions_beyond_its_most_and_takes_one_when_one_ends() {
    let dev = SoftDevice::new();
    let config = SessionConfig {
        max_sessions: 3,
        ..SessionConfig::default()
    };
    let host = SessionHost::soft(&dev, config).unwrap();
    let other = SessionHost::soft(&dev, SessionConfig::default()).unwrap();
    let (a, b) = host.connect_soft(&host).unwrap();
    let (c, c_peer) = host.connect_soft(&other).unwrap();
    assert_eq!(host.sessions(), 3);
    let err = host.connect_soft(&other).unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::HostFull {
                most: 3,
                peer: false
            }
        ),
        "{err:?}"
    );
    assert!(err
        .to_string()
        .contains("this host holds its most sessions, 3"));
    let err = other.connect_soft(&host).unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::HostFull {
                most: 3,
                peer: true
            }
        ),
        "{err:?}"
    );
    // Refused before either side took anything.
    assert_eq!((host.sessions(), other.sessions()), (3, 1));
    // The sessions it holds go on.
    let mut msg = c.alloc_local_mr(bytes(8)).unwrap();
    msg.fill(5);
    within(c.send(msg.slice(..))).await.0.unwrap();
    assert_eq!(*within(c_peer.receive()).await.unwrap(), [5u8; 8]);
    drop((a, b));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while host.sessions() > 1 {
        assert!(std::time::Instant::now() < deadline, "the pair never left");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (d, _d_peer) = host.connect_soft(&other).unwrap();
    assert!(d.failure().is_none());
    assert!(SessionConfig {
        max_sessions: 0,
        ..SessionConfig::default()
    }
    .check()
    .is_err());
}

/// Messages the device refuses to post (a NIC out of resources) come
/// back with their error and take none of the peer's window: more of them
/// than the window holds leave the session able to send.
#[tokio::test]
async fn sends_the_device_refuses_to_post_take_no_window() {
    let (client, server) = pair(SessionConfig {
        recv_depth: 8,
        user_window: 2,
        ..SessionConfig::default()
    });
    let refuse_next = || {
        client
            .with_queue_pair(|qp| qp.control().refuse_posts(1))
            .unwrap()
    };
    let mut msg = client.alloc_local_mr(bytes(8)).unwrap();
    msg.fill(7);
    let mut msg = msg.slice(..);
    for _ in 0..3 {
        refuse_next();
        let (sent, back) = within(client.send(msg)).await;
        let err = sent.expect_err("refused by the device");
        assert!(err.to_string().contains("out of resources"), "{err}");
        msg = back;
    }
    within(client.send(msg)).await.0.unwrap();
    assert_eq!(*within(server.receive()).await.unwrap(), [7u8; 8]);
    assert!(client.failure().is_none());

    let remote = within(client.request_remote_mr(bytes(64))).await.unwrap();
    let mut local = client.alloc_local_mr(bytes(64)).unwrap();
    local.fill(0xab);
    for _ in 0..3 {
        refuse_next();
        let (written, back) = within(client.write_with_imm(local, remote.remote(), 9)).await;
        written.expect_err("refused by the device");
        local = back;
    }
    let (written, _) = within(client.write_with_imm(local, remote.remote(), 42)).await;
    assert_eq!(written.unwrap(), 64);
    assert_eq!(within(server.receive_write_imm()).await.unwrap(), 42);
}

#[tokio::test]
async fn atomics_on_a_requested_region() {
    let (client, server) = pair(SessionConfig::default());
    let remote = within(client.request_remote_mr_with(
        bytes(16),
        RemoteAccess::READ | RemoteAccess::WRITE | RemoteAccess::ATOMIC,
    ))
    .await
    .unwrap();
    let word = || {
        client
            .alloc_local_mr_zeroed(bytes(8))
            .unwrap()
            .word(0)
            .unwrap()
    };
    let (old, w) = within(client.fetch_add(word(), remote.word(8).unwrap(), 5)).await;
    old.unwrap();
    assert_eq!(w.get(), 0);
    let (swapped, w) = within(client.atomic_cas(word(), remote.word(8).unwrap(), 5, 9)).await;
    swapped.unwrap();
    assert_eq!(w.get(), 5, "the old value comes back");
    client.send_remote_mr(remote).unwrap();
    let region = within(server.receive_local_mr()).await.unwrap();
    assert_eq!(u64::from_ne_bytes(region[8..16].try_into().unwrap()), 9);
}

#[tokio::test]
async fn requests_beyond_the_caps_are_refused_and_the_session_goes_on() {
    let config = SessionConfig {
        max_remote_region: 4096,
        max_remote_total: 8192,
        max_remote_rights: RemoteAccess::READ | RemoteAccess::WRITE,
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    let refused = |r: Result<_, SessionError>| match r {
        Err(SessionError::Refused(reason)) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refused(within(client.request_remote_mr(bytes(4097))).await),
        RefuseReason::TooLarge
    );
    let atomic = client.request_remote_mr_with(bytes(8), RemoteAccess::ATOMIC);
    assert_eq!(refused(within(atomic).await), RefuseReason::Rights);
    let a = within(client.request_remote_mr(bytes(4096))).await.unwrap();
    let b = within(client.request_remote_mr(bytes(4096))).await.unwrap();
    assert_eq!(
        refused(within(client.request_remote_mr(bytes(1))).await),
        RefuseReason::Quota
    );
    // Handing one back frees its share of the quota once the server's
    // user has it back.
    client.send_remote_mr(a).unwrap();
    let _a = within(server.receive_local_mr()).await.unwrap();
    let c = within(async {
        loop {
            match client.request_remote_mr(bytes(4096)).await {
                Err(SessionError::Refused(RefuseReason::Quota)) => tokio::task::yield_now().await,
                other => break other,
            }
        }
    })
    .await
    .unwrap();
    drop((b, c)); // dropping releases them
    assert!(client.failure().is_none());
    assert!(matches!(
        within(client.request_remote_mr(bytes(0))).await,
        Err(SessionError::Device(_))
    ));
}

/// Regions handed back and not yet taken by our user count against the
/// peer's 4096 regions, whatever their bytes: a peer that asks for tiny
/// regions and hands each back cannot pile up entries without bound.
#[tokio::test]
async fn regions_handed_back_and_not_taken_count_against_the_peer_s_regions() {
    let (client, server) = pair(SessionConfig::default());
    for _ in 0..4096 {
        let region = within(client.request_remote_mr(bytes(1))).await.unwrap();
        client.send_remote_mr(region).unwrap();
    }
    let refused = within(async {
        loop {
            match client.request_remote_mr(bytes(1)).await {
                // Answered before the last hand-backs arrived: ask again.
                Ok(region) => {
                    client.send_remote_mr(region).unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => break e,
            }
        }
    })
    .await;
    assert!(
        matches!(refused, SessionError::Refused(RefuseReason::Quota)),
        "{refused}"
    );
    // Once our user takes one back, the peer may have one more.
    let _taken = within(server.receive_local_mr()).await.unwrap();
    let one_more = within(async {
        loop {
            match client.request_remote_mr(bytes(1)).await {
                Err(SessionError::Refused(RefuseReason::Quota)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                other => break other,
            }
        }
    })
    .await;
    assert!(one_more.is_ok(), "{one_more:?}");
    assert!(client.failure().is_none());
}

/// The quota counts what a grant takes from the allocator, not the bytes
/// asked for (a byte aligned to 4 KiB takes 4 KiB), and a region handed
/// back counts until our user takes it: a peer that asks and hands back
/// in a loop cannot pile up our memory.
#[tokio::test]
async fn the_quota_counts_memory_taken_and_regions_not_yet_taken_back() {
    let config = SessionConfig {
        max_remote_total: 8192,
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    let page_aligned_byte = Layout::from_size_align(1, 4096).unwrap();
    let a = within(client.request_remote_mr(page_aligned_byte))
        .await
        .unwrap();
    let b = within(client.request_remote_mr(page_aligned_byte))
        .await
        .unwrap();
    assert!(matches!(
        within(client.request_remote_mr(page_aligned_byte)).await,
        Err(SessionError::Refused(RefuseReason::Quota))
    ));
    // Dropped, `b` is released: freed, its share with it. Handed back, `a`
    // waits for the server's user, and counts until it is taken.
    drop(b);
    client.send_remote_mr(a).unwrap();
    let one_more = || async {
        loop {
            match client.request_remote_mr(page_aligned_byte).await {
                Err(SessionError::Refused(RefuseReason::Quota)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                other => break other.unwrap(),
            }
        }
    };
    let c = within(one_more()).await;
    let still_held = timeout(Duration::from_millis(300), one_more()).await;
    assert!(
        still_held.is_err(),
        "a region handed back and not taken is free"
    );
    let a = within(server.receive_local_mr()).await.unwrap();
    assert_eq!(a.len(), 1);
    let d = within(one_more()).await;
    drop((c, d));
    assert!(client.failure().is_none());
}

#[tokio::test]
async fn a_granted_region_is_revoked_when_its_lease_ends() {
    let config = SessionConfig {
        lease: Duration::from_millis(150),
        max_remote_total: 4096,
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    let remote = within(client.request_remote_mr(bytes(4096))).await.unwrap();
    let expires = remote.expires_at().expect("a lease");
    assert!(expires > std::time::Instant::now());
    tokio::time::sleep_until(expires.into()).await;
    // The quota comes free again: the server takes its region back.
    let again = within(async {
        loop {
            match client.request_remote_mr(bytes(4096)).await {
                Ok(again) => break again,
                Err(SessionError::Refused(RefuseReason::Quota)) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    drop(again);
    // The stale descriptor no longer reaches the server's memory.
    let local = client.alloc_local_mr(bytes(8)).unwrap();
    let (late, local) = within(client.write(local, remote.slice(0..8).unwrap())).await;
    assert!(late.is_err(), "a write after the lease must fail");
    assert_eq!(local.len(), 8, "our buffer comes back with the error");
    let failure = within(async {
        loop {
            if let Some(f) = client.failure() {
                break f;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        matches!(failure, SessionError::Disconnected(_)),
        "{failure}"
    );
    drop(server);
}

#[tokio::test]
async fn a_sent_region_comes_home_when_its_lease_ends() {
    let config = SessionConfig {
        lease: Duration::from_millis(100),
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    let mut region = client.alloc_local_mr(bytes(64)).unwrap();
    region.fill(3);
    client.send_local_mr(region, RemoteAccess::READ).unwrap();
    let held = within(server.receive_remote_mr()).await.unwrap();
    let back = within(client.receive_local_mr()).await.unwrap();
    assert!(back.iter().all(|&b| b == 3));
    // The server's late return of an expired region is not an error.
    server.send_remote_mr(held).unwrap();
    // A request leaves by the same queue of control messages, after the
    // return, and the client handles its arrivals in order: once the
    // grant is in, the client has handled the return.
    within(server.request_remote_mr(bytes(8))).await.unwrap();
    assert!(client.failure().is_none() && server.failure().is_none());
}

#[tokio::test]
async fn a_lease_runs_from_when_the_region_was_sent_not_from_when_it_is_taken() {
    let lease = Duration::from_secs(6);
    let config = SessionConfig {
        lease,
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    let sent = std::time::Instant::now();
    let region = client.alloc_local_mr(bytes(64)).unwrap();
    client.send_local_mr(region, RemoteAccess::READ).unwrap();
    // The server's user takes the region a while after it arrived.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = within(server.receive_remote_mr()).await.unwrap();
    let expires = held.expires_at().expect("a lease");
    // The client takes it back at `sent + lease` (or a little after): the
    // server's clock must not promise more than that, beyond the time
    // the message took to arrive.
    assert!(
        expires <= sent + lease + Duration::from_secs(1),
        "the lease ends {:?} after it was sent, for a lease of {lease:?}",
        expires - sent
    );
    // A read well within the lease the server was told of succeeds.
    let local = server.alloc_local_mr(bytes(64)).unwrap();
    let (read, _local) = within(server.read(local, held.remote())).await;
    read.unwrap();
    assert!(server.failure().is_none());
}

/// One peer with many sessions cannot take the memory every session of
/// the host needs: what all peers hold stops at half the memory limit
/// (a grant past it is refused as out of memory), and another session's
/// messages still flow while the greedy ones hold all they could get,
/// handed back and never taken by the host's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_s_grants_leave_the_host_s_other_sessions_their_memory() {
    let dev = SoftDevice::new();
    let server_config = SessionConfig {
        arena_bytes: 1 << 20,
        memory_limit: 8 << 20,
        max_remote_region: 1 << 20,
        // Four sessions could take twice the memory limit.
        max_remote_total: 4 << 20,
        ..SessionConfig::default()
    };
    let server = SessionHost::soft(&dev, server_config).unwrap();
    let client = SessionHost::soft(&dev, SessionConfig::default()).unwrap();
    let (victim, victim_peer) = client.connect_soft(&server).unwrap();
    let mut greedy = Vec::new();
    let mut granted = 0;
    let mut refusals = Vec::new();
    for _ in 0..4 {
        let (c, s) = client.connect_soft(&server).unwrap();
        for size in [1 << 20, 64 << 10, 4096] {
            loop {
                match within(c.request_remote_mr(bytes(size))).await {
                    Ok(region) => {
                        granted += size;
                        c.send_remote_mr(region).unwrap();
                    }
                    Err(e) => {
                        refusals.push(e.to_string());
                        break;
                    }
                }
            }
        }
        greedy.push((c, s));
    }
    assert!(
        (2 << 20..=4 << 20).contains(&granted),
        "{granted} bytes granted"
    );
    assert!(
        refusals.iter().any(|e| e.contains("memory")),
        "{refusals:?}"
    );
    // The host's own user still has memory, and the other session's
    // messages flow both ways (each takes a receive the host posts
    // again; the host's each take memory for their trailers).
    for _ in 0..10 {
        let msg = victim_peer.alloc_local_mr(bytes(64)).unwrap();
        within(victim_peer.send(msg.slice(..))).await.0.unwrap();
        within(victim.receive()).await.unwrap();
    }
    let receiver = tokio::spawn(async move {
        for _ in 0..40 {
            within(victim_peer.receive()).await.unwrap();
        }
    });
    for i in 0..40 {
        let msg = victim.alloc_local_mr(bytes(8)).unwrap();
        let (sent, _) = timeout(Duration::from_secs(5), victim.send(msg.slice(..)))
            .await
            .unwrap_or_else(|_| panic!("message {i} stalled"));
        sent.unwrap();
    }
    within(receiver).await.unwrap();
    drop(greedy);
}

/// Handing a region back on a session the peer closed sends nothing,
/// and says so, rather than report a hand-back that never went.
#[tokio::test]
async fn handing_a_region_back_after_the_peer_closed_says_it_did_not_go() {
    let (client, server) = pair(SessionConfig::default());
    let remote = within(client.request_remote_mr(bytes(64))).await.unwrap();
    drop(server);
    // The close arrives: a receive ends with it.
    assert!(matches!(
        within(client.receive()).await,
        Err(SessionError::Closed(_))
    ));
    match client.send_remote_mr(remote) {
        Err(SessionError::Closed(why)) => assert!(why.contains("peer"), "{why}"),
        other => panic!("expected the session's close, got {other:?}"),
    }
}

#[tokio::test]
async fn a_remote_region_goes_back_only_through_its_own_session() {
    let dev = SoftDevice::new();
    let host = SessionHost::soft(&dev, SessionConfig::default()).unwrap();
    let (a, a_peer) = host.connect_soft(&host).unwrap();
    let (b, _b_peer) = host.connect_soft(&host).unwrap();
    assert_eq!(host.sessions(), 4);
    let remote = within(a.request_remote_mr(bytes(64))).await.unwrap();
    assert!(matches!(
        b.send_remote_mr(remote),
        Err(SessionError::WrongSession)
    ));
    // Refused, and handed back through `a` after all.
    let back = within(a_peer.receive_local_mr()).await.unwrap();
    assert_eq!(back.len(), 64);
}

#[tokio::test]
async fn a_window_of_unread_messages_holds_the_sender_back() {
    let config = SessionConfig {
        user_window: 4,
        recv_depth: 8,
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    let msg = client.alloc_local_mr(bytes(16)).unwrap();
    let mut msg = msg.slice(..);
    for _ in 0..4 {
        let (sent, m) = within(client.send(msg)).await;
        sent.unwrap();
        msg = m;
    }
    // The fifth waits for the server's user.
    let fifth = client.send(msg);
    tokio::pin!(fifth);
    assert!(timeout(Duration::from_millis(200), &mut fifth)
        .await
        .is_err());
    // Control still flows while user messages wait.
    let remote = within(client.request_remote_mr(bytes(8))).await.unwrap();
    drop(remote);
    for _ in 0..2 {
        within(server.receive()).await.unwrap();
    }
    within(&mut fifth).await.0.unwrap();
    for _ in 0..3 {
        within(server.receive()).await.unwrap();
    }
}

#[tokio::test]
async fn many_messages_both_ways_at_once() {
    let config = SessionConfig {
        recv_depth: 8,
        user_window: 3,
        ..SessionConfig::default()
    };
    let (a, b) = pair(config);
    let (a, b) = (Arc::new(a), Arc::new(b));
    let n = 500u32;
    let talk = |me: Arc<Session<SoftQp>>| async move {
        let sender = async {
            let mut msg = me.alloc_local_mr(bytes(4)).unwrap().slice(..);
            for i in 0..n {
                let mut region = msg.into_inner();
                region.copy_from_slice(&i.to_le_bytes());
                let (sent, m) = me.send(region.slice(..)).await;
                sent.unwrap();
                msg = m;
            }
        };
        let receiver = async {
            for i in 0..n {
                let got = me.receive().await.unwrap();
                assert_eq!(u32::from_le_bytes(got[..].try_into().unwrap()), i);
            }
        };
        futures::join!(sender, receiver);
    };
    within(async { futures::join!(talk(Arc::clone(&a)), talk(Arc::clone(&b))) }).await;
}

#[tokio::test]
async fn closing_is_seen_by_the_peer_after_what_was_sent() {
    let (client, server) = pair(SessionConfig::default());
    let mut msg = client.alloc_local_mr(bytes(3)).unwrap();
    msg.copy_from_slice(b"bye");
    within(client.send(msg.slice(..))).await.0.unwrap();
    client.close();
    assert_eq!(&within(server.receive()).await.unwrap()[..], b"bye");
    assert!(matches!(
        within(server.receive()).await,
        Err(SessionError::Closed(_))
    ));
    assert!(matches!(
        within(server.request_remote_mr(bytes(8))).await,
        Err(SessionError::Closed(_))
    ));
}

/// A session dropped after its peer closed has no Close to send: it goes
/// at once, not after the grace a Close of its own is given (here far
/// longer than any stall of a loaded machine, so the two cannot blur).
#[tokio::test]
async fn closing_after_the_peer_closed_waits_for_nothing() {
    let dev = SoftDevice::new();
    let config = SessionConfig {
        close_grace: Duration::from_secs(60),
        ..SessionConfig::default()
    };
    let host = SessionHost::soft(&dev, config).unwrap();
    let (first, second) = host.connect_soft(&host).unwrap();
    drop(first);
    assert!(matches!(
        within(second.receive()).await,
        Err(SessionError::Closed(_))
    ));
    let dropped = std::time::Instant::now();
    drop(second);
    while host.sessions() > 0 {
        assert!(
            dropped.elapsed() < Duration::from_secs(20),
            "still open after {:?}",
            dropped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A session whose close message is not acknowledged waits the close
/// grace for it, then goes.
#[tokio::test]
async fn an_unacknowledged_close_waits_the_grace_then_goes() {
    let dev = SoftDevice::new();
    // Longer than the default, so that a grace not taken from the config
    // would show.
    let grace = Duration::from_millis(2500);
    let config = SessionConfig {
        close_grace: grace,
        ..SessionConfig::default()
    };
    let host = SessionHost::soft(&dev, config).unwrap();
    let (first, second) = host.connect_soft(&host).unwrap();
    first
        .with_queue_pair(|qp| qp.control().hold_acks())
        .unwrap();
    let dropped = std::time::Instant::now();
    drop(first);
    // The close arrives; only its acknowledgement is held.
    assert!(matches!(
        within(second.receive()).await,
        Err(SessionError::Closed(_))
    ));
    within(async {
        while host.sessions() > 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // A lower bound: load only makes it later.
    assert!(dropped.elapsed() >= grace, "{:?}", dropped.elapsed());
    assert_eq!(host.sessions(), 1);
}

#[tokio::test]
async fn a_fatal_queue_pair_error_fails_pending_waits() {
    let (_client, server) = pair(SessionConfig::default());
    let mut waiting = std::pin::pin!(server.receive());
    // Waiting before the error, so the error must reach a waiter.
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    server
        .with_queue_pair(|qp| qp.control().inject_fatal())
        .unwrap();
    let err = within(waiting).await.unwrap_err();
    assert!(matches!(err, SessionError::Disconnected(_)), "{err}");
}

#[tokio::test]
async fn a_vanished_peer_fails_the_next_send() {
    let (client, _server) = pair(SessionConfig::default());
    client
        .with_queue_pair(|qp| qp.control().break_connection())
        .unwrap();
    let msg = client.alloc_local_mr(bytes(8)).unwrap();
    let (sent, msg) = within(client.send(msg.slice(..))).await;
    assert!(sent.is_err());
    assert_eq!(msg.len(), 8, "the buffer comes back");
    let err = within(client.receive()).await.unwrap_err();
    assert!(matches!(err, SessionError::Disconnected(_)), "{err}");
}

#[tokio::test]
async fn device_events_reach_the_host() {
    let dev = SoftDevice::new();
    let host = SessionHost::soft(&dev, SessionConfig::default()).unwrap();
    let events = host.events();
    dev.set_port_active(false);
    let event = within(events.next()).await;
    assert!(
        matches!(event, Some(AsyncEvent::PortError { .. })),
        "{event:?}"
    );
    dev.set_port_active(true);
    assert!(matches!(
        within(events.next()).await,
        Some(AsyncEvent::PortActive { .. })
    ));
}

// ---- hostile peers ----------------------------------------------------

/// A session connected to a bare queue pair (`wire`).
struct RawPeer {
    session: Session<SoftQp>,
    wire: Wire,
}

/// The bare queue pair in its own ring, with receives posted: a peer
/// that speaks bytes, not the protocol.
struct Wire {
    ring: Ring<SoftQp>,
    pd: Arc<rdma_ring::backend::soft::SoftPd>,
}

fn raw_peer(config: SessionConfig) -> RawPeer {
    let dev = SoftDevice::new();
    let host = SessionHost::soft(&dev, config).unwrap();
    let hello = Hello {
        recv_depth: 16,
        user_window: 8,
        max_message: 4096,
    };
    let qp_config = QpConfig {
        max_recv_wr: 16,
        ..QpConfig::default()
    };
    let (session, qp, pd) = host.connect_soft_raw(hello, qp_config).unwrap();
    let mut ring = Ring::new(qp, RingConfig::default());
    for _ in 0..16 {
        let buf = RegisteredBuf::new(&*pd, vec![0u8; 4096 + 16]).unwrap();
        ring.submission().push(Recv::new(buf)).unwrap();
    }
    ring.submit().unwrap();
    RawPeer {
        session,
        wire: Wire { ring, pd },
    }
}

impl Wire {
    fn send(&mut self, bytes: Vec<u8>) {
        let buf = RegisteredBuf::new(&*self.pd, bytes).unwrap();
        self.ring.submission().push(Send::new(buf)).unwrap();
        self.ring.submit().unwrap();
    }

    /// The next message the session sent, decoded.
    fn next_message(&mut self) -> Vec<u8> {
        loop {
            let done = self.ring.completion().wait(1).unwrap();
            for c in done {
                if c.kind() == rdma_ring::op::OpKind::Recv {
                    let len = c.byte_len() as usize;
                    let buf = c.into_buf();
                    return buf[..len].to_vec();
                }
            }
        }
    }
}

/// A one-byte user message `n`, reporting nothing processed or taken.
fn user_message(n: u8) -> Vec<u8> {
    let mut m = vec![n];
    m.extend_from_slice(
        &Trailer {
            kind: Kind::User,
            processed: 0,
            taken: 0,
        }
        .encode(),
    );
    m
}

async fn protocol_failure(session: &Session<SoftQp>) -> String {
    within(async {
        loop {
            match session.failure() {
                Some(SessionError::Protocol(why)) => break why,
                Some(other) => panic!("expected a protocol failure, got {other}"),
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_malformed_control_message_ends_the_session_clearly() {
    let mut peer = raw_peer(SessionConfig::default());
    let mut bad = Control::Close.encode(0, 0);
    bad[3] = 77; // unknown kind
    peer.wire.send(bad);
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("unknown kind"), "{why}");
    // Waiting calls get the same clear error, not a hang.
    let err = within(peer.session.receive()).await.unwrap_err();
    assert!(matches!(err, SessionError::Protocol(_)), "{err}");
    // Local memory is still the user's: allocating works.
    assert!(peer.session.alloc_local_mr(bytes(64)).is_ok());
}

#[tokio::test]
async fn garbage_shorter_than_a_trailer_is_refused() {
    let mut peer = raw_peer(SessionConfig::default());
    peer.wire.send(vec![1, 2, 3]);
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("shorter than"), "{why}");
}

/// A message longer than the receive buffers the session's hello told
/// the peer of breaks the protocol (the device fails the receive).
#[tokio::test]
async fn a_message_longer_than_the_hello_allows_is_refused() {
    let mut peer = raw_peer(SessionConfig::default());
    peer.wire.send(vec![0u8; 64 * 1024]);
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("longer than its receive buffer"), "{why}");
}

#[tokio::test]
async fn counts_of_messages_never_sent_are_refused() {
    let mut peer = raw_peer(SessionConfig::default());
    peer.wire.send(Control::Ack.encode(5, 0));
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("processed"), "{why}");
}

#[tokio::test]
async fn returning_a_region_never_lent_is_refused() {
    let mut peer = raw_peer(SessionConfig::default());
    peer.wire.send(Control::Return { id: 99 }.encode(0, 0));
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("never lent"), "{why}");
}

/// Region 0 is never lent (numbers start at 1): handing it back breaks
/// the protocol too.
#[tokio::test]
async fn returning_region_zero_is_refused() {
    let mut peer = raw_peer(SessionConfig::default());
    peer.wire.send(Control::Return { id: 0 }.encode(0, 0));
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("never lent"), "{why}");
}

/// Receive buffers have room for control messages, so a user message past
/// a small `max_message` may fit them: the session still refuses it, as
/// its hello said.
#[tokio::test]
async fn a_user_message_past_our_max_message_is_refused_even_if_it_fits() {
    let config = SessionConfig {
        max_message: 0,
        ..SessionConfig::default()
    };
    let mut peer = raw_peer(config);
    let mut message = vec![7u8; 40];
    message.extend_from_slice(
        &Trailer {
            kind: Kind::User,
            processed: 0,
            taken: 0,
        }
        .encode(),
    );
    peer.wire.send(message);
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("max_message"), "{why}");
}

/// Regions lent to us that our user has not received yet are not handed
/// out once the peer closed: it took back everything it lent.
#[tokio::test]
async fn regions_lent_before_the_peer_closed_are_not_handed_out() {
    let (a, b) = pair(SessionConfig::default());
    let region = b.alloc_local_mr(bytes(4096)).unwrap();
    b.send_local_mr(region, RemoteAccess::READ).unwrap();
    drop(b);
    // The lend came before the close, which `receive` reports.
    let closed = within(a.receive()).await.unwrap_err();
    assert!(matches!(closed, SessionError::Closed(_)), "{closed}");
    let lent = within(a.receive_remote_mr()).await;
    assert!(
        matches!(lent, Err(SessionError::Closed(_))),
        "{:?}",
        lent.map(|r| r.len())
    );
}

/// A peer that hands back a region whose descriptor it was never sent (it
/// waits here for the peer's window) breaks the protocol: it cannot know
/// of the region.
#[tokio::test]
async fn returning_a_region_not_yet_sent_is_refused() {
    let mut peer = raw_peer(SessionConfig::default());
    // The peer processes nothing: its receives are the session's whole
    // window, and lends beyond it wait.
    for _ in 0..20 {
        let region = peer.session.alloc_local_mr(bytes(64)).unwrap();
        peer.session
            .send_local_mr(region, RemoteAccess::READ)
            .unwrap();
    }
    // What went out: the receives the window allows (all but one of the
    // peer's 16, which stays for a report), each a lend.
    const WINDOW: usize = 15;
    let mut sent = Vec::new();
    let deadline = std::time::Instant::now() + PATIENCE;
    while sent.len() < WINDOW {
        assert!(
            std::time::Instant::now() < deadline,
            "only {sent:?} went out"
        );
        let mut done = Vec::new();
        peer.wire.ring.completion().reap(&mut done).unwrap();
        for message in done {
            assert_eq!(message.kind(), rdma_ring::op::OpKind::Recv);
            let len = message.byte_len() as usize;
            let bytes = message.into_buf()[..len].to_vec();
            match rdma_ring::session::wire::decode(&bytes) {
                Ok((_, Message::Control(Control::Lend(region)))) => sent.push(region.id),
                other => panic!("expected a lend, got {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let unsent = sent.iter().max().expect("lends went out") + 1;
    assert!(unsent <= 20, "every lend went out: {sent:?}");
    let mut more = Vec::new();
    peer.wire.ring.completion().reap(&mut more).unwrap();
    assert!(more.is_empty(), "more than the window went out");
    peer.wire.send(Control::Release { id: unsent }.encode(0, 0));
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("has not been sent"), "{why}");
}

#[tokio::test]
async fn a_grant_nobody_asked_for_is_refused() {
    let mut peer = raw_peer(SessionConfig::default());
    let region = RegionDescriptor {
        id: 1,
        remote: RemoteSlice::new(0x1000, 64, 5, RemoteAccess::WRITE),
        lease_ms: 0,
    };
    peer.wire
        .send(Control::AllocGrant { request: 7, region }.encode(0, 0));
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("not waiting"), "{why}");
}

/// A peer that ignores flow control, sending past the receives we told
/// it we had (it reports none of our answers processed, so they pile up
/// unsent), is cut off once our depth of its messages arrived past our
/// last report, not answered without end. (Our reports stop once our
/// answers have used the room the peer gave us: when that is, the grants
/// being made aside, decides how many get in before the cut.)
#[tokio::test]
async fn control_messages_past_our_depth_are_a_flood() {
    let config = SessionConfig {
        recv_depth: 8,
        user_window: 2,
        ..SessionConfig::default()
    };
    let mut peer = raw_peer(config);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut request = 0u64;
    while peer.session.failure().is_none() && std::time::Instant::now() < deadline {
        // Our sends' completions, reaped to make room for more.
        while let Ok(Some(_)) = peer.wire.ring.completion().poll() {}
        let ask = Control::AllocRequest {
            request: request + 1,
            size: 8,
            align: 8,
            rights: RemoteAccess::READ,
        };
        let buf = RegisteredBuf::new(&*peer.wire.pd, ask.encode(0, 0)).unwrap();
        if peer.wire.ring.submission().push(Send::new(buf)).is_ok() {
            peer.wire.ring.submit().unwrap();
            request += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("past our last report"), "{why}");
}

#[tokio::test]
async fn more_messages_than_the_window_is_a_flood() {
    let config = SessionConfig {
        user_window: 2,
        recv_depth: 8,
        ..SessionConfig::default()
    };
    let mut peer = raw_peer(config);
    for n in 0..3 {
        peer.wire.send(user_message(n));
    }
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("window"), "{why}");
    // The two within the window were delivered before the failure.
    assert_eq!(&within(peer.session.receive()).await.unwrap()[..], &[0]);
    assert_eq!(&within(peer.session.receive()).await.unwrap()[..], &[1]);
}

/// Against a shallower peer our window counts in the smaller depth, as
/// the peer counts it: a peer going past that is flooding, though our
/// own window is wider.
#[tokio::test]
async fn the_window_a_shallower_peer_floods_is_the_one_both_sides_count() {
    // Ours: 32 deep with a window of 16; the raw peer's: 16 deep, so both
    // count a window of 15 for us.
    let mut peer = raw_peer(SessionConfig::default());
    for n in 0..16u8 {
        peer.wire.send(user_message(n));
    }
    let why = protocol_failure(&peer.session).await;
    assert!(why.contains("user window of 15"), "{why}");
    for n in 0..15u8 {
        assert_eq!(&within(peer.session.receive()).await.unwrap()[..], &[n]);
    }
}

#[tokio::test]
async fn a_lying_descriptor_fails_the_operation_and_gives_the_buffer_back() {
    let mut peer = raw_peer(SessionConfig::default());
    let lie = RegionDescriptor {
        id: 1,
        remote: RemoteSlice::new(0xdead_0000, 4096, 0xbad, RemoteAccess::READ),
        lease_ms: 0,
    };
    peer.wire.send(Control::Lend(lie).encode(0, 0));
    let remote = within(peer.session.receive_remote_mr()).await.unwrap();
    let into = peer.session.alloc_local_mr_zeroed(bytes(64)).unwrap();
    let (read, into) = within(peer.session.read(into, remote.slice(0..64).unwrap())).await;
    let err = read.unwrap_err();
    assert!(err.to_string().to_lowercase().contains("remote"), "{err}");
    assert_eq!(into.len(), 64);
    std::mem::forget(remote); // its session is broken; nothing to hand back
}

#[tokio::test]
async fn a_request_the_peer_ignores_times_out_and_a_late_grant_goes_back() {
    let config = SessionConfig {
        request_timeout: Duration::from_millis(100),
        ..SessionConfig::default()
    };
    let mut peer = raw_peer(config);
    let err = within(peer.session.request_remote_mr(bytes(64)))
        .await
        .unwrap_err();
    assert!(matches!(err, SessionError::Timeout(_)), "{err}");
    // The peer saw the request; its late grant comes straight back.
    let request = peer.wire.next_message();
    let (_, message) = rdma_ring::session::wire::decode(&request).unwrap();
    let rdma_ring::session::wire::Message::Control(Control::AllocRequest { request, size, .. }) =
        message
    else {
        panic!("expected a request, got {message:?}");
    };
    assert_eq!(size, 64);
    let region = RegionDescriptor {
        id: 5,
        remote: RemoteSlice::new(0x1000, 64, 5, RemoteAccess::WRITE),
        lease_ms: 0,
    };
    peer.wire
        .send(Control::AllocGrant { request, region }.encode(1, 0));
    let back = peer.wire.next_message();
    let (_, message) = rdma_ring::session::wire::decode(&back).unwrap();
    assert_eq!(
        message,
        rdma_ring::session::wire::Message::Control(Control::Release { id: 5 })
    );
    assert!(peer.session.failure().is_none());
}

/// A grant held back by the asker's flow control until after its lease
/// ended never goes out as a grant (the region is already freed): the
/// request is answered with a refusal instead.
#[tokio::test]
async fn a_grant_whose_lease_ends_before_it_can_go_is_refused_instead() {
    use rdma_ring::session::wire::{decode, Message};
    let config = SessionConfig {
        lease: Duration::from_millis(100),
        ..SessionConfig::default()
    };
    let mut peer = raw_peer(config);
    for request in 1..=16u64 {
        let ask = Control::AllocRequest {
            request,
            size: 64,
            align: 8,
            rights: RemoteAccess::WRITE,
        };
        peer.wire.send(ask.encode(0, 0));
    }
    // Every control message the session sends, acks included, in order,
    // with how many messages came so far.
    let mut received = 0u32;
    let mut arrived = std::collections::VecDeque::<Vec<u8>>::new();
    let mut next_control = |wire: &mut Wire| loop {
        if let Some(bytes) = arrived.pop_front() {
            received += 1;
            match decode(&bytes).unwrap().1 {
                Message::Control(control) => return (control, received),
                other => panic!("expected a control message, got {other:?}"),
            }
        }
        for c in wire.ring.completion().wait(1).unwrap() {
            if c.kind() == rdma_ring::op::OpKind::Recv {
                let len = c.byte_len() as usize;
                arrived.push_back(c.into_buf()[..len].to_vec());
            }
        }
    };
    // We report none of the session's messages processed: it keeps the
    // last of the 16 receives our hello announced for an ack, so 15
    // messages go (grants, and acks between them) and the rest wait.
    let mut granted = Vec::new();
    let mut seen = 0;
    while seen < 15 {
        let (answer, count) = next_control(&mut peer.wire);
        match answer {
            Control::Ack => {}
            Control::AllocGrant { request, .. } => granted.push(request),
            other => panic!("expected a grant, got {other:?}"),
        }
        seen = count;
    }
    assert!(!granted.is_empty(), "grants go");
    assert!(
        granted.iter().copied().eq(1..=granted.len() as u64),
        "{granted:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..8 {
        let buf = RegisteredBuf::new(&*peer.wire.pd, vec![0u8; 4096 + 16]).unwrap();
        peer.wire.ring.submission().push(Recv::new(buf)).unwrap();
    }
    peer.wire.ring.submit().unwrap();
    peer.wire.send(Control::Ack.encode(seen, 0));
    // Each answer that waited past its lease is a refusal, in order.
    for request in granted.len() as u64 + 1..=16 {
        let answer = loop {
            match next_control(&mut peer.wire).0 {
                Control::Ack => {}
                answer => break answer,
            }
        };
        assert_eq!(
            answer,
            Control::AllocRefuse {
                request,
                reason: RefuseReason::LeaseEnded
            }
        );
    }
    assert!(peer.session.failure().is_none());
}

#[tokio::test]
async fn a_peer_leaving_mid_request_fails_the_request_at_once() {
    let RawPeer { session, mut wire } = raw_peer(SessionConfig::default());
    let session = Arc::new(session);
    let asking = tokio::spawn({
        let session = Arc::clone(&session);
        async move { session.request_remote_mr(bytes(64)).await }
    });
    let request = tokio::task::spawn_blocking(move || {
        let request = wire.next_message();
        wire.send(Control::Close.encode(1, 0));
        (request, wire)
    })
    .await
    .unwrap();
    let (_, message) = rdma_ring::session::wire::decode(&request.0).unwrap();
    assert!(matches!(
        message,
        rdma_ring::session::wire::Message::Control(Control::AllocRequest { .. })
    ));
    let err = within(asking).await.unwrap().unwrap_err();
    assert!(matches!(err, SessionError::Closed(_)), "{err}");
}

#[tokio::test]
async fn regions_lent_to_a_peer_that_closes_come_home() {
    let (client, server) = pair(SessionConfig::default());
    let mut region = client.alloc_local_mr(bytes(128)).unwrap();
    region.fill(6);
    client.send_local_mr(region, RemoteAccess::WRITE).unwrap();
    let held = within(server.receive_remote_mr()).await.unwrap();
    std::mem::forget(held); // the server never hands it back...
    drop(server); // ...and leaves
    let back = within(client.receive_local_mr()).await.unwrap();
    assert!(back.iter().all(|&b| b == 6));
    assert!(matches!(
        within(client.receive_local_mr()).await,
        Err(SessionError::Closed(_))
    ));
}

#[tokio::test]
async fn control_messages_fit_even_when_user_messages_are_tiny() {
    let config = SessionConfig {
        max_message: 0,
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    let remote = within(client.request_remote_mr(bytes(64))).await.unwrap();
    client.send_remote_mr(remote).unwrap();
    assert_eq!(within(server.receive_local_mr()).await.unwrap().len(), 64);
    let msg = client.alloc_local_mr(bytes(1)).unwrap();
    let (sent, _) = within(client.send(msg.slice(..))).await;
    assert!(matches!(
        sent,
        Err(SessionError::TooLarge { len: 1, max: 0 })
    ));
    // An empty message still goes.
    let msg = client.alloc_local_mr(bytes(1)).unwrap();
    within(client.send(msg.slice(..0))).await.0.unwrap();
    assert_eq!(within(server.receive()).await.unwrap().len(), 0);
}

#[tokio::test]
async fn crossing_bursts_of_requests_with_a_shallow_queue() {
    let config = SessionConfig {
        recv_depth: 4,
        user_window: 2,
        ..SessionConfig::default()
    };
    let (a, b) = pair(config);
    fn asks(
        s: &Session<SoftQp>,
    ) -> impl std::future::Future<Output = Vec<Result<rdma_ring::session::RemoteRegion, SessionError>>>
           + '_ {
        futures::future::join_all((0..12).map(move |_| s.request_remote_mr(bytes(64))))
    }
    let (ra, rb) = within(async { futures::join!(asks(&a), asks(&b)) }).await;
    assert!(ra.into_iter().chain(rb).all(|r| r.is_ok()));
}

/// A waker that panics when woken.
#[derive(Default)]
struct PanickingWaker(std::sync::atomic::AtomicBool);

impl std::task::Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        // Said first: a test checks the panic happened.
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        panic!("a waker that panics");
    }
}

impl PanickingWaker {
    fn panicked(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The host's pump runs the wakers of tasks waiting on its sessions: one
/// that panics neither stops the pump (every session of the host relies
/// on it) nor leaves the session half-updated.
#[tokio::test]
async fn a_panicking_waker_does_not_stop_the_pump() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let (client, server) = pair(SessionConfig::default());
    let panics = Arc::new(PanickingWaker::default());
    let panicking = Waker::from(Arc::clone(&panics));
    let mut first = Box::pin(server.receive());
    assert!(first
        .as_mut()
        .poll(&mut Context::from_waker(&panicking))
        .is_pending());
    for word in [&b"one"[..], b"two"] {
        let mut msg = client.alloc_local_mr(bytes(3)).unwrap();
        msg.copy_from_slice(word);
        within(client.send(msg.slice(..))).await.0.unwrap();
    }
    // The pump woke the waiting receive, and its waker panicked.
    within(async {
        while !panics.panicked() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let got = within(std::future::poll_fn(|cx| first.as_mut().poll(cx))).await;
    assert_eq!(&got.unwrap()[..], b"one");
    assert_eq!(&within(server.receive()).await.unwrap()[..], b"two");
    let mut reply = server.alloc_local_mr(bytes(4)).unwrap();
    reply.copy_from_slice(b"pong");
    within(server.send(reply.slice(..))).await.0.unwrap();
    assert_eq!(&within(client.receive()).await.unwrap()[..], b"pong");
}

/// A session whose host's completion queue fails (it overruns) fails its
/// waiting futures: the queue gives no completion more, and they would
/// otherwise wait for ever.
#[tokio::test]
async fn sessions_fail_when_their_host_s_completion_queue_fails() {
    let (client, server) = pair(SessionConfig::default());
    server
        .with_queue_pair(|qp| qp.control().overrun_cq())
        .unwrap();
    match within(server.receive()).await {
        Err(SessionError::Disconnected(why)) => assert!(why.contains("ring failed"), "{why}"),
        other => panic!(
            "expected the ring's failure, got {:?}",
            other.map(|m| m.len())
        ),
    }
    assert!(server.failure().is_some());
    drop(client);
}

/// A session whose user leaves finished operations uncollected fills the
/// host's shared slab: another session's receive, posted again once a
/// message arrived, waits for room rather than failing that session.
#[test]
fn a_slab_full_of_another_session_s_results_fails_no_session() {
    use futures::executor::block_on;
    let dev = SoftDevice::new();
    let config = SessionConfig::default();
    let crowded = SessionHost::soft(&dev, config).unwrap();
    let other = SessionHost::soft(&dev, config).unwrap();
    let (hog, _hog_peer) = crowded.connect_soft(&other).unwrap();
    let (quiet, quiet_peer) = crowded.connect_soft(&other).unwrap();
    let target = block_on(hog.request_remote_mr(bytes(64))).unwrap();
    let mut uncollected = Vec::new();
    loop {
        let write = hog.write(hog.alloc_local_mr(bytes(8)).unwrap(), target.remote());
        if write.was_refused() {
            match block_on(write).0 {
                Err(rdma_ring::Error::Unclaimed(_)) => break,
                // The host's pump has not reaped the send queue's
                // completions yet: they go on to fill the slab.
                Err(rdma_ring::Error::SendQueueFull { .. }) => {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                other => panic!("refused for another reason: {other:?}"),
            }
        }
        uncollected.push(write);
        assert!(uncollected.len() < 1 << 20, "the slab never filled");
    }
    // A message to the other session: its receive is posted again when
    // the host's slab has room.
    let mut msg = quiet_peer.alloc_local_mr(bytes(5)).unwrap();
    msg.copy_from_slice(b"first");
    let (sent, msg) = block_on(quiet_peer.send(msg.slice(..)));
    sent.unwrap();
    let mut msg = msg.into_inner();
    std::thread::sleep(Duration::from_millis(200));
    assert!(quiet.failure().is_none(), "{:?}", quiet.failure());
    drop(uncollected);
    assert_eq!(&block_on(quiet.receive()).unwrap()[..], b"first");
    msg.copy_from_slice(b"again");
    block_on(quiet_peer.send(msg.slice(..))).0.unwrap();
    assert_eq!(&block_on(quiet.receive()).unwrap()[..], b"again");
    assert!(quiet.failure().is_none());
}

/// Sessions of different depths: the shallow side's messages in flight
/// are bounded by its own depth too, so they never take the send queue
/// slots its data operations were promised (`max_send_wr`), nor meet a
/// full send queue themselves. The device is held still while messages
/// queue up that the deep peer's receives would take.
#[tokio::test]
async fn a_deep_peer_s_receives_leave_a_shallow_side_its_send_queue() {
    use rdma_ring::backend::soft::Progress;
    let dev = SoftDevice::new();
    let shallow = SessionConfig {
        recv_depth: 4,
        user_window: 2,
        max_send_wr: 1,
        ..SessionConfig::default()
    };
    let deep = SessionConfig {
        recv_depth: 128,
        user_window: 120,
        ..SessionConfig::default()
    };
    let shallow_host = SessionHost::soft(&dev, shallow).unwrap();
    let deep_host = SessionHost::soft(&dev, deep).unwrap();
    let (a, b) = shallow_host.connect_soft(&deep_host).unwrap();
    let target = within(a.request_remote_mr(bytes(8))).await.unwrap();
    let n = 20;
    dev.set_progress(Progress::Manual);
    let sends = futures::future::join_all((0..n).map(|_| {
        let msg = a.alloc_local_mr(bytes(8)).unwrap();
        a.send(msg.slice(..))
    }));
    tokio::pin!(sends);
    // Nothing completes while the device stands still.
    assert!(timeout(Duration::from_millis(100), &mut sends)
        .await
        .is_err());
    let write = a.write(a.alloc_local_mr(bytes(8)).unwrap(), target.remote());
    assert!(
        !write.was_refused(),
        "the only data operation in flight was refused"
    );
    dev.set_progress(Progress::Auto);
    dev.progress();
    // The deep side's user window counts in the smaller depth too: its
    // user takes the messages as they come.
    let reader = async {
        for _ in 0..n {
            b.receive().await.unwrap();
        }
    };
    let (sent, ()) = within(async { futures::join!(sends, reader) }).await;
    for (i, (sent, _)) in sent.into_iter().enumerate() {
        sent.unwrap_or_else(|e| panic!("message {i}: {e}"));
    }
    assert_eq!(within(write).await.0.unwrap(), 8);
}

/// On a NIC a send's ACK may come late (coalesced, or lost and covered by
/// a later one): the peer's report of our messages processed can then be
/// reaped before those sends' own completions, while they still hold
/// their send queue slots. Messages then wait for slots of their own
/// rather than take those promised to data operations, and nothing
/// fails: the device holds this side's completions back while the peer
/// reads and answers.
#[tokio::test]
async fn late_acks_leave_data_operations_their_send_queue() {
    let config = SessionConfig {
        recv_depth: 4,
        user_window: 2,
        max_send_wr: 1,
        ..SessionConfig::default()
    };
    let (a, b) = pair(config);
    let target = within(a.request_remote_mr(bytes(8))).await.unwrap();
    let executed = || {
        a.with_queue_pair(|qp| qp.control().counters().executed)
            .unwrap()
    };
    let before = executed();
    a.with_queue_pair(|qp| qp.control().hold_acks()).unwrap();
    let n = 20;
    let sends = futures::future::join_all((0..n).map(|_| {
        let msg = a.alloc_local_mr(bytes(8)).unwrap();
        a.send(msg.slice(..))
    }));
    tokio::pin!(sends);
    let reader = async {
        for _ in 0..n {
            b.receive().await.unwrap();
        }
    };
    tokio::pin!(reader);
    {
        let both = async { futures::join!(&mut sends, &mut reader) };
        tokio::pin!(both);
        // The peer takes messages and reports them processed, so messages
        // go on past one depth (4) with no ACK of ours back, until every
        // slot kept for messages (the depth and one) holds one.
        within(async {
            while executed() - before < 5 {
                tokio::select! {
                    _ = &mut both => panic!("every send completed with its ACK held"),
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
        })
        .await;
    }
    let write = a.write(a.alloc_local_mr(bytes(8)).unwrap(), target.remote());
    assert!(
        !write.was_refused(),
        "the only data operation in flight was refused"
    );
    a.with_queue_pair(|qp| qp.control().release_acks()).unwrap();
    let (sent, ()) = within(async { futures::join!(sends, reader) }).await;
    for (i, (sent, _)) in sent.into_iter().enumerate() {
        sent.unwrap_or_else(|e| panic!("message {i}: {e}"));
    }
    assert_eq!(within(write).await.0.unwrap(), 8);
}

/// Data operations beyond `max_send_wr` take the send queue slots kept
/// for messages: a message then waits for room, rather than being
/// refused, and goes once the data operations finish.
#[tokio::test]
async fn a_message_waits_while_data_operations_fill_the_send_queue() {
    let config = SessionConfig {
        recv_depth: 4,
        user_window: 2,
        max_send_wr: 4,
        ..SessionConfig::default()
    };
    let (a, b) = pair(config);
    let target = within(a.request_remote_mr(bytes(8))).await.unwrap();
    a.with_queue_pair(|qp| qp.control().hold_acks()).unwrap();
    // The send queue: 4 places for data and 5 for messages (the request's
    // message is done); 9 writes take them all.
    let writes: Vec<_> = (0..9)
        .map(|_| a.write(a.alloc_local_mr(bytes(8)).unwrap(), target.remote()))
        .collect();
    assert!(writes.iter().all(|w| !w.was_refused()));
    let msg = a.alloc_local_mr(bytes(8)).unwrap();
    let send = a.send(msg.slice(..));
    tokio::pin!(send);
    assert!(
        timeout(Duration::from_millis(100), &mut send)
            .await
            .is_err(),
        "the message went (or failed) with the send queue full"
    );
    a.with_queue_pair(|qp| qp.control().release_acks()).unwrap();
    for write in writes {
        assert_eq!(within(write).await.0.unwrap(), 8);
    }
    within(send).await.0.unwrap();
    within(b.receive()).await.unwrap();
}

/// A peer keeps at most 1024 regions lent to it waiting for its user: a
/// user lending more, before the peer's user received them, is refused
/// with a clear error and its region handed back, and the session goes
/// on (the peer would otherwise take the 1025th as a protocol breach).
#[tokio::test]
async fn lending_more_than_the_peer_keeps_waiting_is_refused_here() {
    let (client, server) = pair(SessionConfig::default());
    for _ in 0..1024 {
        let region = client.alloc_local_mr(bytes(8)).unwrap();
        client.send_local_mr(region, RemoteAccess::READ).unwrap();
    }
    let region = client.alloc_local_mr(bytes(8)).unwrap();
    let (e, region) = client
        .send_local_mr(region, RemoteAccess::READ)
        .unwrap_err();
    assert!(matches!(e, SessionError::TooManyLent { max: 1024 }), "{e}");
    // The peer takes one and hands it back: room for one more.
    let remote = within(server.receive_remote_mr()).await.unwrap();
    server.send_remote_mr(remote).unwrap();
    within(client.receive_local_mr()).await.unwrap();
    client.send_local_mr(region, RemoteAccess::READ).unwrap();
    for _ in 0..1024 {
        within(server.receive_remote_mr()).await.unwrap();
    }
    assert!(client.failure().is_none() && server.failure().is_none());
}

/// Regions taken back at the end of their lease still count against the
/// peer's limit until the peer hands them back: its user may not have
/// received them, and the peer keeps them waiting. Lending more is
/// refused here, and room comes back as the peer lets them go.
#[tokio::test]
async fn regions_whose_lease_ended_count_until_the_peer_hands_them_back() {
    let config = SessionConfig {
        lease: Duration::from_millis(200),
        ..SessionConfig::default()
    };
    let (client, server) = pair(config);
    for _ in 0..1024 {
        let region = client.alloc_local_mr(bytes(8)).unwrap();
        client.send_local_mr(region, RemoteAccess::READ).unwrap();
    }
    // Their leases end: every one comes home.
    for _ in 0..1024 {
        within(client.receive_local_mr()).await.unwrap();
    }
    let region = client.alloc_local_mr(bytes(8)).unwrap();
    let (e, mut region) = client
        .send_local_mr(region, RemoteAccess::READ)
        .unwrap_err();
    assert!(matches!(e, SessionError::TooManyLent { max: 1024 }), "{e}");
    // The server's user takes one (its lease over) and lets it go.
    drop(within(server.receive_remote_mr()).await.unwrap());
    within(async {
        loop {
            match client.send_local_mr(region, RemoteAccess::READ) {
                Ok(()) => break,
                Err((SessionError::TooManyLent { .. }, back)) => region = back,
                Err((e, _)) => panic!("{e}"),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(client.failure().is_none() && server.failure().is_none());
}

/// A request that timed out, or whose future was dropped, while flow
/// control still held it back is never sent: the peer would register
/// memory for nobody.
#[tokio::test]
async fn requests_given_up_before_they_could_go_are_never_sent() {
    use rdma_ring::session::wire::{decode, Message};
    use std::future::Future;
    use std::task::{Context, Waker};
    // Long enough for the 15 that go to be sent first, on a loaded host:
    // one still held back when its time ran out would never go.
    let config = SessionConfig {
        request_timeout: Duration::from_secs(1),
        ..SessionConfig::default()
    };
    let mut peer = raw_peer(config);
    let mut cx = Context::from_waker(Waker::noop());
    // The peer reports nothing processed: 15 requests go, and the rest
    // wait (the last of its 16 receives is kept for an ack).
    let mut sent: Vec<_> = (0..15)
        .map(|_| Box::pin(peer.session.request_remote_mr(bytes(8))))
        .collect();
    for future in &mut sent {
        assert!(future.as_mut().poll(&mut cx).is_pending());
    }
    let mut seen = 0u32;
    while seen < 15 {
        for c in peer.wire.ring.completion().wait(1).unwrap() {
            if c.kind() == rdma_ring::op::OpKind::Recv {
                let len = c.byte_len() as usize;
                let buf = c.into_buf();
                assert!(matches!(
                    decode(&buf[..len]).unwrap().1,
                    Message::Control(Control::AllocRequest { .. })
                ));
                seen += 1;
            }
        }
    }
    let mut dropped = Box::pin(peer.session.request_remote_mr(bytes(8)));
    assert!(dropped.as_mut().poll(&mut cx).is_pending());
    drop(dropped);
    let err = within(peer.session.request_remote_mr(bytes(8)))
        .await
        .unwrap_err();
    assert!(matches!(err, SessionError::Timeout(_)), "{err}");
    // The peer reports all processed: neither held-back request goes.
    for _ in 0..15 {
        let buf = RegisteredBuf::new(&*peer.wire.pd, vec![0u8; 4096 + 16]).unwrap();
        peer.wire.ring.submission().push(Recv::new(buf)).unwrap();
    }
    peer.wire.ring.submit().unwrap();
    peer.wire.send(Control::Ack.encode(seen, 0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Some(c) = peer.wire.ring.completion().poll().unwrap() {
        if c.kind() == rdma_ring::op::OpKind::Recv && c.status().is_success() {
            let len = c.byte_len() as usize;
            let buf = c.into_buf();
            let message = decode(&buf[..len]).unwrap().1;
            assert!(
                !matches!(message, Message::Control(Control::AllocRequest { .. })),
                "a request given up went: {message:?}"
            );
        }
    }
    assert!(peer.session.failure().is_none());
    drop(sent);
}

/// Requests nobody waits for any more stay open until the peer answers
/// (a late grant must go back). A peer that never answers cannot make
/// them grow without bound: past 4096 open, a request fails at once, and
/// room comes back as the peer answers.
#[tokio::test]
async fn requests_the_peer_never_answers_are_bounded() {
    use rdma_ring::session::wire::{decode, Message};
    use std::future::Future;
    use std::task::{Context, Waker};
    // The requests must all go out before any times out: one still held
    // back by flow control then would never be sent.
    let mut peer = raw_peer(SessionConfig {
        request_timeout: Duration::from_secs(120),
        ..SessionConfig::default()
    });
    // Each future queues its request on its first poll, and is kept until
    // its request went: one dropped while flow control still holds its
    // request back takes the request back with it.
    let mut asking: Vec<_> = (0..4096)
        .map(|_| Box::pin(peer.session.request_remote_mr(bytes(8))))
        .collect();
    for future in &mut asking {
        let polled = future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending());
    }
    // The peer takes them all, reporting each processed (so that more
    // can go), and answers none.
    let (mut requests, mut seen, mut acked) = (0, 0u32, 0u32);
    while requests < 4096 {
        let done = peer.wire.ring.completion().wait(1).unwrap();
        for c in done {
            if c.kind() != rdma_ring::op::OpKind::Recv {
                continue;
            }
            let len = c.byte_len() as usize;
            seen += 1;
            if let Message::Control(Control::AllocRequest { .. }) =
                decode(&c.into_buf()[..len]).unwrap().1
            {
                requests += 1;
            }
            let buf = RegisteredBuf::new(&*peer.wire.pd, vec![0u8; 4096 + 16]).unwrap();
            peer.wire.ring.submission().push(Recv::new(buf)).unwrap();
        }
        peer.wire.ring.submit().unwrap();
        // Every eighth: acks are messages too, and the session, which
        // reports its own count only on what it sends, takes no more
        // than its depth of them unreported.
        if seen - acked >= 8 {
            peer.wire.send(Control::Ack.encode(seen, 0));
            acked = seen;
        }
    }
    drop(asking);
    let err = within(peer.session.request_remote_mr(bytes(8)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionError::TooManyRequests { max: 4096 }),
        "{err}"
    );
    assert!(peer.session.failure().is_none());
    // The peer answers the first: room for one more, and one only.
    peer.wire.send(
        Control::AllocRefuse {
            request: 1,
            reason: RefuseReason::Quota,
        }
        .encode(seen, 0),
    );
    let answered = std::time::Instant::now() + PATIENCE;
    let one_more = loop {
        let mut one_more = Box::pin(peer.session.request_remote_mr(bytes(8)));
        let polled = one_more
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        if polled.is_pending() {
            break one_more;
        }
        assert!(std::time::Instant::now() < answered, "no room came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let err = within(peer.session.request_remote_mr(bytes(8)))
        .await
        .unwrap_err();
    assert!(matches!(err, SessionError::TooManyRequests { .. }), "{err}");
    assert!(peer.session.failure().is_none());
    drop(one_more);
}
