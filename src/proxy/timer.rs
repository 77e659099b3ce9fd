//! A precise timer for release deadlines.
//!
//! tokio's timer wheel rounds every deadline up to the next millisecond, which would turn a
//! 100 µs LAN delay into about a millisecond. This timer keeps absolute deadlines in a heap on
//! one dedicated thread that sleeps on a condition variable with the kernel's timer slack set to
//! 1 ns (so the sleep is an hrtimer, accurate to a few microseconds), and wakes the waiting task
//! a little *before* its deadline. The task then spins the last few microseconds itself, which
//! absorbs the thread-to-task wake-up latency. Nothing spins while nothing is due: the thread
//! blocks, and a task spins at most [`SPIN_MAX`].

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How early the timer thread wakes a task: covers the condvar's own wake-up error and the
/// scheduling of the task on a tokio worker (tens of µs on the 2-core VMs we run on).
const LEAD: Duration = Duration::from_micros(60);
/// A task closer than this to its deadline spins instead of sleeping.
const SPIN_MAX: Duration = Duration::from_micros(90);

/// Waits until `deadline` with microsecond precision. Never completes early.
pub fn sleep_until(deadline: Instant) -> PreciseSleep {
    PreciseSleep { deadline }
}

/// Future returned by [`sleep_until`].
#[derive(Debug)]
pub struct PreciseSleep {
    deadline: Instant,
}

impl Future for PreciseSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let now = Instant::now();
        if now >= self.deadline {
            return Poll::Ready(());
        }
        if self.deadline - now <= SPIN_MAX {
            while Instant::now() < self.deadline {
                std::hint::spin_loop();
            }
            return Poll::Ready(());
        }
        TimerThread::get().register(self.deadline - LEAD, cx.waker().clone());
        Poll::Pending
    }
}

struct Entry {
    wake_at: Instant,
    /// Registration order: breaks ties so `Ord` is total without comparing wakers.
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.wake_at, self.seq).cmp(&(other.wake_at, other.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Reverse<Entry>>,
    next_seq: u64,
}

struct TimerThread {
    state: Mutex<State>,
    /// Signalled when a new earliest deadline arrives.
    changed: Condvar,
}

impl TimerThread {
    fn get() -> &'static TimerThread {
        static TIMER: OnceLock<&'static TimerThread> = OnceLock::new();
        TIMER.get_or_init(|| {
            let timer: &'static TimerThread = Box::leak(Box::new(TimerThread {
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("faultrig-timer".into())
                .spawn(move || timer.run())
                .expect("spawn the timer thread");
            timer
        })
    }

    fn register(&self, wake_at: Instant, waker: Waker) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = state
            .heap
            .peek()
            .is_none_or(|Reverse(e)| wake_at < e.wake_at);
        let seq = state.next_seq;
        state.next_seq += 1;
        state.heap.push(Reverse(Entry {
            wake_at,
            seq,
            waker,
        }));
        drop(state);
        if earliest {
            self.changed.notify_one();
        }
    }

    fn run(&self) {
        // The default 50 µs slack would let the kernel coalesce our wake-ups that late.
        if let Err(e) = nix::sys::prctl::set_timerslack(1) {
            tracing::warn!("cannot reduce timer slack ({e}); release times may be ~50 µs late");
        }
        let mut due = Vec::new();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            while let Some(Reverse(top)) = state.heap.peek() {
                if top.wake_at > now {
                    break;
                }
                let Reverse(entry) = state.heap.pop().expect("peeked");
                due.push(entry.waker);
            }
            if !due.is_empty() {
                drop(state);
                for waker in due.drain(..) {
                    waker.wake();
                }
                state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state = match state.heap.peek() {
                None => self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(Reverse(top)) => {
                    let wait = top.wake_at - now;
                    self.changed
                        .wait_timeout(state, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn never_wakes_early_and_is_not_rounded_to_milliseconds() {
        let mut late = Vec::new();
        for i in 0..40u64 {
            let deadline = Instant::now() + Duration::from_micros(150 + 37 * i);
            sleep_until(deadline).await;
            let now = Instant::now();
            assert!(now >= deadline);
            late.push(now - deadline);
        }
        late.sort();
        // Generous: tokio's timer would be ~1 ms late at the median. A busy machine can delay
        // single wake-ups, not most of them.
        assert!(late[late.len() / 2] < Duration::from_millis(5), "{late:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_sleepers_all_complete_in_order_of_deadline() {
        let start = Instant::now();
        let handles: Vec<_> = (0..200u64)
            .map(|i| {
                tokio::spawn(async move {
                    let deadline = start + Duration::from_micros(100 + (i * 7919) % 5000);
                    sleep_until(deadline).await;
                    assert!(Instant::now() >= deadline);
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
    }
}
