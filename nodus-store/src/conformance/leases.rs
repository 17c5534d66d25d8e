//! Conformance of leases: claims, renewals, expiry and take-over, and replicas racing to claim.

use std::collections::BTreeMap;
use std::sync::Arc;

use nodus_core::Store;
use nodus_core::journal::{Intent, Outcome};
use nodus_core::resource::Kind;
use nodus_core::store::{Error, ObjectKey};

use super::{OWNER_A, OWNER_B, completion, join_all, lease, run_document, step, time, unique};

/// Leases: another owner's claim is refused with `Leased` while the lease runs, the holder
/// may claim again and renew; after expiry another owner takes the run over and the old
/// holder's fence can no longer append, complete, renew or release; a released lease is
/// free at once; an expired lease nobody took over can still be renewed.
pub async fn leases<S: Store + Clone + 'static>(store: S) {
    let uid = unique("run");
    let a1 = store
        .claim(&uid, &lease(OWNER_A, 0))
        .await
        .expect("a claims");
    store
        .append_step(&uid, a1, &step(0, Intent::Route { turn: 0 }))
        .await
        .expect("a appends");

    // B is refused while A's lease (30 s from 0) runs.
    for at in [0, 10, 29] {
        assert_eq!(
            store.claim(&uid, &lease(OWNER_B, at)).await,
            Err(Error::Leased {
                run: uid.clone(),
                owner: OWNER_A.to_string(),
                until: time(30),
            }),
            "b claims at {at}"
        );
    }
    // A claims again: a new fence; its first is stale.
    let a2 = store
        .claim(&uid, &lease(OWNER_A, 10))
        .await
        .expect("a again");
    assert_ne!(a1, a2);
    assert_eq!(
        store
            .append_step(&uid, a1, &step(1, Intent::Answer { turn: 0 }))
            .await,
        Err(Error::Fenced { run: uid.clone() })
    );
    // A renews at 20: its lease now runs to 50.
    store
        .renew(&uid, a2, &lease(OWNER_A, 20))
        .await
        .expect("a renews");
    assert_eq!(
        store.claim(&uid, &lease(OWNER_B, 45)).await,
        Err(Error::Leased {
            run: uid.clone(),
            owner: OWNER_A.to_string(),
            until: time(50),
        })
    );

    // At 50 it has expired: B takes the run over.
    let b1 = store
        .claim(&uid, &lease(OWNER_B, 50))
        .await
        .expect("b takes over after expiry");
    assert_ne!(b1, a2);
    let fenced = Err(Error::Fenced { run: uid.clone() });
    assert_eq!(
        store
            .append_step(&uid, a2, &step(1, Intent::Answer { turn: 0 }))
            .await,
        fenced
    );
    assert_eq!(
        store
            .complete_step(&uid, a2, 0, &completion(0, Outcome::Answered))
            .await,
        fenced
    );
    assert_eq!(store.renew(&uid, a2, &lease(OWNER_A, 51)).await, fenced);
    assert_eq!(store.release(&uid, a2).await, fenced);
    assert_eq!(
        store.journal(&uid).await,
        Ok(vec![step(0, Intent::Route { turn: 0 })]),
        "the fenced writer changed nothing"
    );
    assert_eq!(
        store.claim(&uid, &lease(OWNER_A, 60)).await,
        Err(Error::Leased {
            run: uid.clone(),
            owner: OWNER_B.to_string(),
            until: time(80),
        }),
        "now A is refused"
    );
    store
        .complete_step(&uid, b1, 0, &completion(0, Outcome::Answered))
        .await
        .expect("b completes the open step");

    // B releases: A may claim at once, and B's fence is stale after that.
    store.release(&uid, b1).await.expect("b releases");
    let a3 = store
        .claim(&uid, &lease(OWNER_A, 61))
        .await
        .expect("a claims a released run");
    assert_eq!(
        store
            .append_step(&uid, b1, &step(1, Intent::Answer { turn: 0 }))
            .await,
        fenced
    );
    store
        .append_step(&uid, a3, &step(1, Intent::Answer { turn: 0 }))
        .await
        .expect("a appends after its claim");

    // A's lease (to 91) expired and nobody took over: A may still renew, then B waits.
    store
        .renew(&uid, a3, &lease(OWNER_A, 200))
        .await
        .expect("renew after expiry, nobody took over");
    assert_eq!(
        store.claim(&uid, &lease(OWNER_B, 201)).await,
        Err(Error::Leased {
            run: uid.clone(),
            owner: OWNER_A.to_string(),
            until: time(230),
        })
    );
    assert_eq!(store.journal(&uid).await.map(|j| j.len()), Ok(2));

    // A run nobody claimed cannot be renewed or released.
    let unclaimed = unique("run");
    assert_eq!(
        store.renew(&unclaimed, a3, &lease(OWNER_A, 0)).await,
        Err(Error::Fenced {
            run: unclaimed.clone()
        })
    );
    assert_eq!(
        store.release(&unclaimed, a3).await,
        Err(Error::Fenced { run: unclaimed })
    );
}

/// Several replicas race to claim the same runs at the same time: every run is claimed by
/// exactly one replica (the others are refused with `Leased`), and each replica's fence
/// writes its runs' journals.
pub async fn replicas_racing<S: Store + Clone + 'static>(store: S) {
    const RUNS: usize = 40;
    const REPLICAS: usize = 4;
    let project = unique("racing");
    let mut runs = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let name = format!("run-{i:02}");
        let uid = unique("uid");
        store
            .create(
                &ObjectKey::new(&project, Kind::AgentRun, &name),
                run_document(&name, &uid),
            )
            .await
            .expect("create");
        runs.push(uid);
    }
    let runs = Arc::new(runs);
    let barrier = Arc::new(tokio::sync::Barrier::new(REPLICAS));
    let mut tasks = Vec::with_capacity(REPLICAS);
    for replica in 0..REPLICAS {
        let store = store.clone();
        let runs = Arc::clone(&runs);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let owner = format!("replica-{replica}");
            barrier.wait().await;
            let mut mine = Vec::new();
            // Each replica starts at another run, so that claims of one run collide.
            for i in 0..RUNS {
                let uid = &runs[(i + replica * 7) % RUNS];
                let fence = match store.claim(uid, &lease(&owner, 0)).await {
                    Ok(fence) => fence,
                    Err(Error::Leased { .. }) => continue,
                    Err(other) => panic!("claiming {uid}: {other}"),
                };
                store
                    .append_step(uid, fence, &step(0, Intent::Route { turn: 0 }))
                    .await
                    .expect("the claimer writes its run's journal");
                mine.push(uid.clone());
                tokio::task::yield_now().await;
            }
            mine
        }));
    }
    let mut claimed_by = BTreeMap::new();
    for (replica, mine) in join_all(tasks).await.into_iter().enumerate() {
        for uid in mine {
            if let Some(earlier) = claimed_by.insert(uid.clone(), replica) {
                panic!("{uid} was claimed by replica {earlier} and replica {replica}");
            }
        }
    }
    assert_eq!(claimed_by.len(), RUNS, "every run is claimed");
    for uid in runs.iter() {
        assert_eq!(
            store.journal(uid).await.map(|j| j.len()),
            Ok(1),
            "one writer per run"
        );
    }
}
