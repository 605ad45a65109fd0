//! One user's share of a listener's connections: at most `max` open at
//! once per user, so one tenant can never hold every connection of a
//! shared pool. A user is a uid: the kernel's (`SO_PEERCRED`) on a Unix
//! socket, or the one a session's authenticated id names on the data port.
//! Callers without a user (operators with the cluster token) take no
//! share. It only counts; it never reads or closes a connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Open connections per user, at most `max` each.
#[derive(Debug)]
pub struct Users {
    max: usize,
    open: Mutex<HashMap<u32, usize>>,
}

/// A user's place among the open connections; given back on drop.
#[derive(Debug)]
pub struct UserPlace {
    users: Arc<Users>,
    uid: u32,
}

impl Users {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for `uid`, or how many it holds already (the most it may).
    ///
    /// # Errors
    /// The user's count, when it holds `max` places.
    pub fn take(self: &Arc<Self>, uid: u32) -> Result<UserPlace, usize> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(uid).or_default();
        if *n >= self.max {
            return Err(*n);
        }
        *n += 1;
        Ok(UserPlace {
            users: Arc::clone(self),
            uid,
        })
    }

    /// A place for `user`, where the caller has one (`None`: a caller
    /// without a user takes no share).
    ///
    /// # Errors
    /// As [`Users::take`].
    pub fn share(self: &Arc<Self>, user: Option<u32>) -> Result<Option<UserPlace>, usize> {
        user.map(|uid| self.take(uid)).transpose()
    }

    /// Places `uid` holds now.
    pub fn held(&self, uid: u32) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&uid).copied().unwrap_or(0)
    }
}

impl Drop for UserPlace {
    fn drop(&mut self) {
        let mut open = self.users.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_user_holds_at_most_its_share_and_gets_it_back() {
        let users = Users::new(2);
        let a = users.take(1).unwrap();
        let _b = users.take(1).unwrap();
        assert_eq!(users.take(1).unwrap_err(), 2);
        let _other = users.take(2).expect("another user has a share of its own");
        drop(a);
        assert_eq!(users.held(1), 1);
        let _c = users.take(1).expect("a place given back is taken again");
    }
}
