//! A reference model for the cascade wheel: random operation sequences are applied to a
//! `TimerWheel` and to a `BTreeMap`, and every observable outcome must agree. Shared by the
//! property tests and the fuzz target.

use std::collections::BTreeMap;

use tokio_wheel::wheel::{Key, TimerWheel};

/// One operation on the wheel. Indices pick among the entries inserted so far (live or not,
/// so stale keys get exercised); deltas are relative to the wheel's current tick.
#[derive(Debug, Clone)]
pub enum Op {
    Insert(u64),
    Remove(usize),
    Reschedule(usize, u64),
    /// Advance by the delta and fire everything due.
    Advance(u64),
    /// Advance by the delta but stop after at most this many fired entries.
    AdvancePartly(u64, usize),
}

struct Model {
    /// id → (deadline, effective deadline = max(deadline, tick when it was last placed)).
    live: BTreeMap<u64, (u64, u64)>,
    keys: Vec<Key>,
    last_fired: u64,
}

/// Applies `ops` to a wheel of the given layout and to the model; panics on any disagreement.
pub fn check(layout: &[u32], ops: &[Op]) {
    let mut wheel: TimerWheel<u64> = TimerWheel::new(layout).expect("valid layout");
    let mut model = Model {
        live: BTreeMap::new(),
        keys: Vec::new(),
        last_fired: 0,
    };
    for op in ops {
        let now = wheel.now();
        match *op {
            Op::Insert(delta) => {
                let id = model.keys.len() as u64;
                let deadline = now.saturating_add(delta);
                model.keys.push(wheel.insert(deadline, id));
                model.live.insert(id, (deadline, deadline.max(now)));
            }
            Op::Remove(pick) => {
                let Some(id) = pick_id(&model, pick) else {
                    continue;
                };
                let removed = wheel.remove(model.keys[id as usize]);
                assert_eq!(removed, model.live.remove(&id).map(|_| id), "remove {id}");
            }
            Op::Reschedule(pick, delta) => {
                let Some(id) = pick_id(&model, pick) else {
                    continue;
                };
                let deadline = now.saturating_add(delta);
                let moved = wheel.reschedule(model.keys[id as usize], deadline);
                assert_eq!(moved, model.live.contains_key(&id), "reschedule {id}");
                if moved {
                    model.live.insert(id, (deadline, deadline.max(now)));
                    assert_eq!(wheel.deadline(model.keys[id as usize]), Some(deadline));
                }
            }
            Op::Advance(delta) => advance(
                &mut wheel,
                &mut model,
                now.saturating_add(delta),
                usize::MAX,
            ),
            Op::AdvancePartly(delta, limit) => {
                advance(&mut wheel, &mut model, now.saturating_add(delta), limit)
            }
        }
        assert_eq!(wheel.len(), model.live.len(), "len after {op:?}");
        let earliest = model.live.values().map(|&(_, effective)| effective).min();
        match (wheel.next_expiration(), earliest) {
            (None, None) => {}
            (Some(next), Some(earliest)) => {
                assert!(next >= wheel.now(), "next expiration {next} behind now");
                assert!(
                    next <= earliest,
                    "next expiration {next} after earliest {earliest}"
                );
            }
            (next, earliest) => panic!("next expiration {next:?} but earliest {earliest:?}"),
        }
    }
    advance(&mut wheel, &mut model, u64::MAX, usize::MAX);
    assert!(wheel.is_empty() && model.live.is_empty());
}

fn pick_id(model: &Model, pick: usize) -> Option<u64> {
    (!model.keys.is_empty()).then(|| (pick % model.keys.len()) as u64)
}

fn advance(wheel: &mut TimerWheel<u64>, model: &mut Model, target: u64, limit: usize) {
    let mut fired = 0;
    while fired < limit {
        let Some(expired) = wheel.poll_expired(target) else {
            break;
        };
        fired += 1;
        let id = expired.item;
        let (deadline, effective) = model
            .live
            .remove(&id)
            .expect("fired twice or after removal");
        assert_eq!(
            expired.deadline, deadline,
            "entry {id} fired with another deadline"
        );
        assert!(
            deadline <= target,
            "entry {id} due {deadline} fired early at {target}"
        );
        assert!(
            effective >= model.last_fired,
            "entry {id} fired out of deadline order"
        );
        model.last_fired = effective;
    }
    if fired < limit {
        assert_eq!(wheel.now(), target.max(wheel.now()));
        let overdue: Vec<_> = model
            .live
            .iter()
            .filter(|(_, (d, _))| *d <= target)
            .collect();
        assert!(
            overdue.is_empty(),
            "due but not fired by {target}: {overdue:?}"
        );
    }
}
