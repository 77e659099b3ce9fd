//! A client connection driven by the calls waiting on it rather than by a task of its own.
//!
//! hyper's and h2's usual set-up spawns the connection future, so every call hops between two
//! tasks: the caller hands its request to the connection task and is woken again with the
//! response. On a one-core load generator those hops cost about as much as the HTTP work. Here
//! the callers poll the connection themselves while they wait; readiness wakes every waiting
//! caller, and whichever runs first drives the I/O for all of them. Between calls nobody polls
//! it, which only delays noticing a server's close until the next call.
//!
//! Only one caller polls the connection at a time. A caller that finds it being polled must
//! not simply leave: what it queued (a request's frames) may have been queued after the poller
//! looked, and if the poller's own call then finishes, nobody would look again — the request
//! would sit unsent until the call timed out. So it leaves the poller a note ([`State::Again`])
//! and the poller polls once more before it lets go. One atomic holds both the claim and the
//! note, so no ordering between two locations has to be argued.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use super::{CallError, Failure};

/// Polls one caller makes in a row before it hands the connection to the others: a connection
/// that keeps asking to be polled again (tokio's co-operative budget spent, say) must not hold
/// a caller's task forever.
const POLLS_IN_A_ROW: u32 = 4;

/// Who may poll the connection (values of [`CallerDriven::state`]).
#[repr(u8)]
enum State {
    /// Nobody is polling it; the next caller to claim it does.
    Idle = 0,
    /// A caller is polling it.
    Polling = 1,
    /// A caller is polling it, and something happened since it began that its poll may have
    /// missed: it polls again before letting go.
    Again = 2,
    /// The connection future has finished.
    Ended = 3,
}

pub(crate) struct CallerDriven<C> {
    /// The connection future; `None` once it has finished. Locked only by the caller that
    /// holds the [`State::Polling`] claim, so the lock never waits.
    connection: Mutex<Option<Pin<Box<C>>>>,
    /// A [`State`].
    state: AtomicU8,
    /// Callers waiting on this connection, woken whenever the connection can make progress.
    waiting: Arc<Waiters>,
}

#[derive(Default)]
struct Waiters(Mutex<Vec<Waker>>);

impl Waiters {
    fn register(&self, waker: &Waker) {
        let mut waiting = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !waiting.iter().any(|w| w.will_wake(waker)) {
            waiting.push(waker.clone());
        }
    }
}

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let wakers = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for w in wakers {
            w.wake();
        }
    }
}

impl<C: Future + Send> CallerDriven<C> {
    pub(crate) fn new(connection: C) -> CallerDriven<C> {
        CallerDriven {
            connection: Mutex::new(Some(Box::pin(connection))),
            state: AtomicU8::new(State::Idle as u8),
            waiting: Arc::new(Waiters::default()),
        }
    }

    /// False once the connection has finished.
    pub(crate) fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) != State::Ended as u8
    }

    /// Runs `exchange` to completion, driving the connection while it waits.
    pub(crate) async fn drive<T>(
        &self,
        exchange: impl Future<Output = Result<T, CallError>>,
    ) -> Result<T, CallError> {
        let mut exchange = std::pin::pin!(exchange);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = exchange.as_mut().poll(cx) {
                return Poll::Ready(r);
            }
            // Registered before the claim: whoever ends up polling for us may wake us.
            self.waiting.register(cx.waker());
            self.poll_connection();
            match exchange.as_mut().poll(cx) {
                Poll::Ready(r) => Poll::Ready(r),
                Poll::Pending if !self.is_open() => Poll::Ready(Err(CallError::new(
                    Failure::Reset,
                    "connection closed before the reply",
                ))),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    /// Polls the connection, or, when another caller is polling it, has that caller poll again.
    fn poll_connection(&self) {
        if !self.claim() {
            return;
        }
        let mut slot = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        let waker = Waker::from(self.waiting.clone());
        let mut cx = Context::from_waker(&waker);
        for _ in 0..POLLS_IN_A_ROW {
            let Some(connection) = slot.as_mut() else {
                return;
            };
            if connection.as_mut().poll(&mut cx).is_ready() {
                *slot = None;
                self.state.store(State::Ended as u8, Ordering::Release);
                // Callers whose exchange waits on a dead connection find out now.
                waker.wake_by_ref();
                return;
            }
            if self.release() {
                return;
            }
        }
        // Still asked to poll again: let go and wake every waiting caller (this one among
        // them), so whichever runs next claims it afresh.
        self.state.store(State::Idle as u8, Ordering::Release);
        drop(slot);
        waker.wake_by_ref();
    }

    /// Takes the right to poll the connection (true), or leaves its poller a note to poll again
    /// (false; also false once the connection has ended).
    fn claim(&self) -> bool {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = match state {
                s if s == State::Idle as u8 => State::Polling,
                s if s == State::Ended as u8 => return false,
                _ => State::Again,
            };
            match self.state.compare_exchange_weak(
                state,
                next as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return state == State::Idle as u8,
                Err(now) => state = now,
            }
        }
    }

    /// Ends a poll: lets go of the connection (true), or, when a note was left meanwhile, takes
    /// it back for one more poll (false).
    fn release(&self) -> bool {
        match self.state.compare_exchange(
            State::Polling as u8,
            State::Idle as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(_) => {
                // Only the poller changes `Again`, so this store loses nothing.
                self.state.store(State::Polling as u8, Ordering::Release);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicUsize;
    use std::task::Waker;

    /// A connection shared by the fake connection future and the calls' exchanges: requests
    /// queued by calls, answered when the connection is polled, as h2 sends queued frames.
    #[derive(Default)]
    struct Link {
        queued: VecDeque<usize>,
        answered: Vec<usize>,
        /// The connection future's waker, woken when a request is queued (h2 does the same).
        connection: Option<Waker>,
        /// Each call's waker, woken when its answer comes.
        calls: Vec<(usize, Waker)>,
        /// Run once, in the middle of a connection poll, after the queue was taken.
        during_poll: Option<Box<dyn FnOnce()>>,
    }

    thread_local! {
        static LINK: RefCell<Link> = RefCell::new(Link::default());
    }

    fn link<R>(f: impl FnOnce(&mut Link) -> R) -> R {
        LINK.with(|l| f(&mut l.borrow_mut()))
    }

    /// The connection: answers every queued request, then (once) lets a hook run, as if
    /// another caller acted while this poll was past the point of looking at the queue.
    struct FakeConnection;

    impl Future for FakeConnection {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let answered = link(|l| {
                l.connection = Some(cx.waker().clone());
                let queued: Vec<usize> = l.queued.drain(..).collect();
                l.answered.extend(&queued);
                let woken: Vec<Waker> = l
                    .calls
                    .iter()
                    .filter(|(id, _)| queued.contains(id))
                    .map(|(_, w)| w.clone())
                    .collect();
                woken
            });
            answered.into_iter().for_each(Waker::wake);
            if let Some(hook) = link(|l| l.during_poll.take()) {
                hook();
            }
            Poll::Pending
        }
    }

    /// One call's exchange: queues request `id`, waking the connection, then waits for its
    /// answer.
    async fn exchange(id: usize) -> Result<(), CallError> {
        let mut queued = false;
        std::future::poll_fn(|cx| {
            link(|l| {
                if l.answered.contains(&id) {
                    return Poll::Ready(Ok(()));
                }
                l.calls.push((id, cx.waker().clone()));
                if !queued {
                    queued = true;
                    l.queued.push_back(id);
                    if let Some(w) = l.connection.clone() {
                        w.wake();
                    }
                }
                Poll::Pending
            })
        })
        .await
    }

    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A request queued while another caller polls the connection is sent, even when that
    /// caller's own call then ends and nobody else would poll again. Before the poller took
    /// notes, the request sat unsent until the call's timeout (seen in CI: one http2-json call
    /// in twelve, at three workers on one connection, timed out after 20 s).
    #[test]
    fn a_request_queued_during_another_callers_poll_is_sent() {
        let driven = Arc::new(CallerDriven::new(FakeConnection));
        let b_woken = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let b_waker = Waker::from(b_woken.clone());
        let a_waker = Waker::from(Arc::new(CountingWaker(AtomicUsize::new(0))));

        let mut a = Box::pin({
            let driven = driven.clone();
            async move { driven.drive(exchange(1)).await }
        });
        // B's call, polled from inside A's connection poll: it queues request 2 after the
        // connection took its queue, and finds the connection being polled.
        let b = Arc::new(Mutex::new(Some(Box::pin({
            let driven = driven.clone();
            async move { driven.drive(exchange(2)).await }
        }))));
        let b_in_hook = b.clone();
        let b_waker_in_hook = b_waker.clone();
        link(|l| {
            l.during_poll = Some(Box::new(move || {
                let mut b = b_in_hook.lock().unwrap();
                let poll = b
                    .as_mut()
                    .unwrap()
                    .as_mut()
                    .poll(&mut Context::from_waker(&b_waker_in_hook));
                assert!(poll.is_pending(), "B cannot be answered yet");
            }))
        });

        // A's call: its poll of the connection answers request 1 (and runs B's first poll).
        let poll = a.as_mut().poll(&mut Context::from_waker(&a_waker));
        assert!(poll.is_ready(), "A is answered by its own poll");
        assert!(
            link(|l| l.answered.contains(&2)),
            "request 2 was left queued with nobody to poll the connection"
        );
        assert!(b_woken.0.load(Ordering::SeqCst) > 0, "B is woken");
        let mut b = b.lock().unwrap().take().unwrap();
        assert!(b
            .as_mut()
            .poll(&mut Context::from_waker(&b_waker))
            .is_ready());
    }

    /// The claim and the note: one poller at a time, a note makes it poll again, and an ended
    /// connection is claimed by nobody.
    #[test]
    fn one_poller_and_notes_to_poll_again() {
        let driven = CallerDriven::new(std::future::pending::<()>());
        let state = || driven.state.load(Ordering::Acquire);
        assert!(driven.claim(), "an idle connection is claimed");
        assert!(!driven.claim(), "a polled one is not");
        assert_eq!(state(), State::Again as u8, "but a note is left");
        assert!(!driven.claim());
        assert!(!driven.release(), "a note means one more poll");
        assert_eq!(state(), State::Polling as u8);
        assert!(driven.release(), "no note, let go");
        assert_eq!(state(), State::Idle as u8);
        driven.state.store(State::Ended as u8, Ordering::Release);
        assert!(!driven.claim());
        assert!(!driven.is_open());
    }

    /// Callers that keep arriving while the connection is polled keep the poller polling only
    /// a bounded number of times; then it lets go and wakes every waiting caller.
    #[test]
    fn a_poller_kept_busy_by_notes_hands_the_connection_on() {
        /// Leaves a note on every poll, as a caller arriving during each would.
        struct Busy(
            Arc<std::sync::OnceLock<std::sync::Weak<CallerDriven<Busy>>>>,
            Arc<AtomicUsize>,
        );
        impl Future for Busy {
            type Output = ();
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
                self.1.fetch_add(1, Ordering::SeqCst);
                let driven = self.0.get().and_then(|w| w.upgrade()).unwrap();
                assert!(!driven.claim());
                Poll::Pending
            }
        }
        let me = Arc::new(std::sync::OnceLock::new());
        let polls = Arc::new(AtomicUsize::new(0));
        let driven = Arc::new(CallerDriven::new(Busy(me.clone(), polls.clone())));
        me.set(Arc::downgrade(&driven)).unwrap();
        let woken = Arc::new(CountingWaker(AtomicUsize::new(0)));
        driven.waiting.register(&Waker::from(woken.clone()));

        driven.poll_connection();
        assert_eq!(polls.load(Ordering::SeqCst), POLLS_IN_A_ROW as usize);
        assert_eq!(driven.state.load(Ordering::Acquire), State::Idle as u8);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "waiting callers woken");
    }
}
