//! Live toxics: a supervisor resolves every change of the proxy's toxics for this connection
//! and publishes it to the connection's readers and writers, which apply it per read.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use rand_chacha::ChaCha8Rng;
use tokio::sync::{watch, Notify};

use super::copy::HandOff;
use super::schedule::{Release, MAX_SLICES_PER_READ};
use crate::fault::{Direction as Dir, LinkModel, StreamKey};
use crate::profile::Profile;
use crate::toxic::{self, ConnectionFaults, DirectionFaults, Draws, Toxic, ToxicKind};

/// Why the supervisor ends a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// reset_peer, or a held timeout's limit: both ends see a reset.
    Reset,
    /// Toxiproxy's timeout toxic timed out or was removed (its `Cleanup` closes the stub):
    /// this direction delivers what was already due, then FIN, and the connection closes, as
    /// Toxiproxy closes its sockets (FIN, not RST).
    Close(Dir),
}

/// Follows a live connection's toxics: resolves each change and publishes it to the readers
/// and writers, and returns when a timed toxic (reset_peer, timeout with a limit) or the
/// removal of a timeout toxic ends the connection.
pub(super) async fn supervise(
    mut toxics: watch::Receiver<Arc<Vec<Toxic>>>,
    base: &Profile,
    mut draws: Draws,
    faults: watch::Sender<Arc<ConnectionFaults>>,
    armed: Arc<Armed>,
) -> Ended {
    // Per direction: when a held timeout began, when a dropping one began, and when
    // reset_peer was armed.
    let mut held_since: [Option<Instant>; 2] = [None; 2];
    let mut dropping_since: [Option<Instant>; 2] = [None; 2];
    let mut armed_at: [Option<Instant>; 2] = [None; 2];
    // The list last resolved, to see which toxics a change removed.
    let mut listed = toxics.borrow().clone();
    let now = Instant::now();
    for d in [Dir::Upstream, Dir::Downstream] {
        let f = faults.borrow();
        if f.direction(d).hold.is_some() {
            held_since[d as usize] = Some(now);
        }
        if f.direction(d).discard.is_some() {
            dropping_since[d as usize] = Some(now);
        }
    }
    loop {
        let current = faults.borrow().clone();
        let mut deadline: Option<(Instant, Ended)> = None;
        let mut sooner = |at: Instant, why: Ended| {
            if deadline.is_none_or(|(t, _)| at < t) {
                deadline = Some((at, why));
            }
        };
        for d in [Dir::Upstream, Dir::Downstream] {
            let f = current.direction(d);
            let i = d as usize;
            if let (Some(Some(limit)), Some(since)) = (f.hold, held_since[i]) {
                sooner(since + limit, Ended::Reset);
            }
            if let (Some(Some(limit)), Some(since)) = (f.discard, dropping_since[i]) {
                sooner(since + limit, Ended::Close(d));
            }
            if let (Some(after), Some(at)) = (f.reset_after, armed_at[i]) {
                sooner(at + after, Ended::Reset);
            }
        }
        let expire = async {
            match deadline {
                Some((at, why)) => {
                    tokio::time::sleep_until(at.into()).await;
                    why
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = toxics.changed() => {
                if changed.is_err() {
                    // The proxy is gone; its shutdown closes this connection.
                    return std::future::pending().await;
                }
                let list = toxics.borrow_and_update().clone();
                // Toxiproxy's timeout toxic closes the connection when it is removed, whether
                // or not its toxicity drew it for this connection (its Cleanup is the type's).
                // Ours reaches only the clients it names.
                let removed = listed
                    .iter()
                    .filter(|t| matches!(t.kind, ToxicKind::Timeout { hold: false, .. }))
                    .filter(|t| draws.reaches(t) && !list.iter().any(|n| n.name == t.name))
                    .map(|t| t.stream)
                    .next();
                let next = toxic::resolve(base, &list, &mut draws);
                listed = list;
                let now = Instant::now();
                for d in [Dir::Upstream, Dir::Downstream] {
                    let (before, after) = (current.direction(d), next.direction(d));
                    let i = d as usize;
                    match (before.hold.is_some(), after.hold.is_some()) {
                        (false, true) => held_since[i] = Some(now),
                        (_, false) => held_since[i] = None,
                        _ => {}
                    }
                    // A changed timeout starts again, as Toxiproxy restarts an updated toxic.
                    if after.discard.is_none() {
                        dropping_since[i] = None;
                    } else if before.discard != after.discard {
                        dropping_since[i] = Some(now);
                    }
                    if after.reset_after.is_none() {
                        armed_at[i] = None;
                    }
                }
                faults.send_replace(Arc::new(next));
                if let Some(d) = removed {
                    return Ended::Close(d);
                }
            }
            () = armed.rung.notified() => {
                let first = std::mem::take(&mut *armed.first.lock().unwrap_or_else(|e| e.into_inner()));
                for (at, seen) in armed_at.iter_mut().zip(first) {
                    if let Some(seen) = seen {
                        at.get_or_insert(seen);
                    }
                }
            }
            why = expire => return why,
        }
    }
}

/// When each direction's reset_peer saw its first bytes, for the supervisor: a slot and a bell,
/// where a channel would allocate a block of messages per connection.
#[derive(Default)]
pub(super) struct Armed {
    /// Per direction, the first arrival under reset_peer not yet taken by the supervisor.
    pub(super) first: Mutex<[Option<Instant>; 2]>,
    pub(super) rung: Notify,
}

/// A direction's view of its connection's live toxics.
pub(super) struct LiveDirection {
    pub(super) which: Dir,
    /// Where it stood when a copy phase handed it over.
    pub(super) handoff: HandOff,
    /// What applies now; the reader and the writer each keep a receiver.
    pub(super) faults: watch::Receiver<Arc<ConnectionFaults>>,
    /// What the reader last took from it (this direction's part is `current.direction(which)`).
    pub(super) current: Arc<ConnectionFaults>,
    pub(super) slicer_stream: StreamKey,
    /// Made from `slicer_stream` when a slicer first cuts: most connections never need it.
    pub(super) slicer_rng: Option<Box<ChaCha8Rng>>,
    /// Tells the supervisor when reset_peer saw its first bytes.
    pub(super) armed: Arc<Armed>,
    /// Bytes carried so far, for limit_data.
    pub(super) carried: u64,
    /// The last slice's release: later bytes wait for it, as behind a real slow sender.
    pub(super) slice_floor: Option<Instant>,
}

impl LiveDirection {
    /// This direction's part of the toxics the reader applies now.
    pub(super) fn now(&self) -> &DirectionFaults {
        self.current.direction(self.which)
    }

    /// Applies toxic changes published since the last read, and arms reset_peer on the first
    /// bytes (or end of stream) seen under it.
    pub(super) fn catch_up(&mut self, model: &mut LinkModel, arrived: Instant) {
        if self.faults.has_changed().unwrap_or(false) {
            self.current = self.faults.borrow_and_update().clone();
            model.retune(&self.now().link, self.current.timing);
        }
        if self.now().reset_after.is_some() {
            let mut first = self.armed.first.lock().unwrap_or_else(|e| e.into_inner());
            if first[self.which as usize].is_none() {
                first[self.which as usize] = Some(arrived);
                self.armed.rung.notify_one();
            }
        }
    }

    /// Cuts `bytes` to what limit_data still allows; true when the limit is reached.
    pub(super) fn clip(&mut self, bytes: &mut Bytes) -> bool {
        let Some(limit) = self.now().limit else {
            self.carried += bytes.len() as u64;
            return false;
        };
        let allowed = limit.saturating_sub(self.carried);
        if (bytes.len() as u64) < allowed {
            self.carried += bytes.len() as u64;
            return false;
        }
        bytes.truncate(allowed as usize);
        self.carried = limit;
        true
    }

    /// The slicer toxic: each release cut into pieces `delay` apart.
    pub(super) fn slice(&mut self, releases: Vec<Release>) -> Vec<Release> {
        let floor = |at: Instant, floor: Option<Instant>| floor.map_or(at, |f| at.max(f));
        let Some(slicer) = self.now().slicer else {
            if self.slice_floor.is_none() {
                return releases;
            }
            return releases
                .into_iter()
                .map(|r| match r {
                    Release::Data(at, b) => Release::Data(floor(at, self.slice_floor), b),
                    other => other,
                })
                .collect();
        };
        let mut out = Vec::new();
        let mut budget = MAX_SLICES_PER_READ;
        for r in releases {
            let Release::Data(at, mut bytes) = r else {
                out.push(r);
                continue;
            };
            let mut t = floor(at, self.slice_floor);
            if budget == 0 {
                // Only when the slicer came on after this read was sized: carried whole.
                out.push(Release::Data(t, bytes));
                continue;
            }
            let stream = self.slicer_stream;
            let rng = self
                .slicer_rng
                .get_or_insert_with(|| Box::new(stream.rng()));
            let pieces = toxic::slice(bytes.len(), &slicer, rng, budget);
            budget -= pieces.len();
            for piece in pieces {
                out.push(Release::Slice(t, bytes.split_to(piece)));
                self.slice_floor = Some(t);
                t += slicer.delay;
            }
        }
        out
    }
}
