//! Taking a lock whose holder may have panicked. A controller's index is consistent only
//! between its methods: one that panicked halfway may have left it inconsistent, and going on
//! with it would decide from half-applied state. So a poisoned lock ends the process with a
//! message saying which lock, rather than being skipped or taken as it is.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, `what` naming it in the message if a panic poisoned it.
#[allow(
    clippy::panic,
    reason = "a poisoned index is a bug to crash on, said above"
)]
pub fn lock<'a, T>(mutex: &'a Mutex<T>, what: &str) -> MutexGuard<'a, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(_) => panic!("the lock of {what} is poisoned: a thread panicked while holding it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_a_crash_that_names_it() {
        let m = std::sync::Arc::new(Mutex::new(0));
        let poisoner = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.lock();
            panic!("while holding it");
        })
        .join();
        let taken = std::panic::catch_unwind(|| *lock(&m, "the test index"));
        let message = taken
            .err()
            .and_then(|e| e.downcast::<String>().ok())
            .map(|s| *s)
            .unwrap_or_default();
        assert!(message.contains("the test index"), "{message}");
    }
}
