//! One conformance suite for every driver (as the log backends have one): each case is written once against a
//! [`Harness`], which makes a driver for a fresh agent and does to its machine what an operator, a crash or a
//! failing workload does behind the agent's back, and is run on the dir driver and on the docker driver.
//!
//! What the agent relies on, case by case: create and destroy may be repeated; destroy of what is absent succeeds; a
//! listing shows exactly this agent's handles (not another agent's, not what someone made by hand) and says which
//! failed; a check finds a failed or vanished handle unhealthy; a driver that cannot reach its machine says so with
//! a transient error on every call (an empty listing would read as "everything is gone"); a create interrupted
//! half-way is finished by the next create.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use leasehold_agent::{CreateOrder, Driver, DriverError, Listed, Spec};
use leasehold_schemas::{AgentName, Position, ResourceId};

/// A driver under test, on a machine the test may also change behind the driver's back.
trait Harness: Sized {
    type Driver: Driver;

    /// A harness with a driver opened for a fresh agent name, or `None` (with a printed reason) when the machine
    /// the driver needs is not there and the suite may skip (never under `CI=true`).
    async fn start() -> Option<Self>;

    fn driver(&self) -> &Self::Driver;

    /// The spec of a resource that works once made.
    fn spec(&self) -> Spec;

    /// Whether the handle of `id` is on the machine (as the machine itself says, not the driver).
    async fn exists(&self, id: ResourceId) -> bool;

    /// Removes the handle of `id` behind the driver's back (an operator's `rm`).
    async fn remove_behind_its_back(&self, id: ResourceId);

    /// Makes the handle of `id` fail for good behind the driver's back (its workload dies).
    async fn fail_behind_its_back(&self, id: ResourceId);

    /// Makes things on the machine that are not this agent's handles (another agent's, made by hand, not named as a
    /// handle): the ids they look like, which the listing must not show.
    async fn make_foreign(&self) -> Vec<ResourceId>;

    /// Whether everything [`Harness::make_foreign`] made is still there, untouched.
    async fn foreign_intact(&self) -> bool;

    /// What a create that was interrupted half-way leaves for `id` (the process died within the call).
    async fn interrupt_a_create(&self, id: ResourceId);

    /// A driver whose machine cannot be reached at all; needs nothing of the machine itself.
    fn unreachable() -> (Self::Driver, Box<dyn std::any::Any>);
}

/// A spec's create order: any epoch and position will do, a driver only records them.
fn order() -> Option<CreateOrder> {
    Some(CreateOrder { epoch: Position(7), position: Position(42) })
}

/// An agent name no other test of this process, and no earlier run, uses.
fn fresh_agent(prefix: &str) -> AgentName {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    AgentName::new(format!("{prefix}-{}-{n}", std::process::id())).expect("an agent name")
}

fn ids_of(listed: &[Listed]) -> Vec<ResourceId> {
    let mut ids: Vec<ResourceId> = listed.iter().map(|l| l.id).collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<ResourceId>) -> Vec<ResourceId> {
    ids.sort();
    ids
}

async fn list<H: Harness>(harness: &H) -> Vec<Listed> {
    harness.driver().list().await.unwrap_or_else(|e| panic!("list: {e}"))
}

/// The cases, each generic over the harness.
mod cases {
    use super::*;

    pub(super) async fn create_twice_is_one_resource<H: Harness>() {
        let Some(h) = H::start().await else { return };
        let id = ResourceId::generate();
        let first = h.driver().create(id, &h.spec()).await.expect("create");
        assert!(h.exists(id).await, "created");
        let second = h.driver().create(id, &h.spec()).await.expect("create of what exists succeeds");
        assert_eq!(first, second, "the same handle, the same native id");
        assert_eq!(list(&h).await, vec![Listed::present(id)], "one handle");
        assert!(h.driver().check(id).await.expect("check").healthy);
        h.driver().destroy(id).await.expect("destroy");
    }

    pub(super) async fn destroy_twice_and_destroy_of_the_absent_succeed<H: Harness>() {
        let Some(h) = H::start().await else { return };
        let id = ResourceId::generate();
        h.driver().destroy(id).await.expect("destroy of what never existed succeeds");
        h.driver().create(id, &h.spec()).await.expect("create");
        h.driver().destroy(id).await.expect("destroy");
        assert!(!h.exists(id).await, "destroyed");
        h.driver().destroy(id).await.expect("destroy again succeeds");
        assert_eq!(list(&h).await, vec![], "nothing left");
    }

    pub(super) async fn a_listing_shows_exactly_this_agents_handles<H: Harness>() {
        let Some(h) = H::start().await else { return };
        assert_eq!(list(&h).await, vec![], "a fresh agent has nothing");
        let mine = sorted(vec![ResourceId::generate(), ResourceId::generate()]);
        for id in &mine {
            h.driver().create(*id, &h.spec()).await.expect("create");
        }
        let foreign = h.make_foreign().await;
        assert!(!foreign.is_empty());
        let listed = list(&h).await;
        assert_eq!(ids_of(&listed), mine, "exactly its own handles; foreign look-alikes {foreign:?}");
        assert!(listed.iter().all(|l| l.failed.is_none()), "{listed:?}");
        assert!(h.foreign_intact().await, "a listing leaves what is not its own alone");
        for id in &mine {
            h.driver().destroy(*id).await.expect("destroy");
        }
        assert_eq!(list(&h).await, vec![]);
        assert!(h.foreign_intact().await, "destroying its own leaves what is not its own alone");
    }

    pub(super) async fn a_handle_removed_behind_its_back_is_gone_and_unhealthy<H: Harness>() {
        let Some(h) = H::start().await else { return };
        let (gone, kept) = (ResourceId::generate(), ResourceId::generate());
        for id in [gone, kept] {
            h.driver().create(id, &h.spec()).await.expect("create");
        }
        h.remove_behind_its_back(gone).await;
        assert_eq!(list(&h).await, vec![Listed::present(kept)], "the removed handle is not listed");
        let health = h.driver().check(gone).await.expect("a check of a vanished handle is an answer, not an error");
        assert!(!health.healthy, "{health:?}");
        assert!(h.driver().check(kept).await.expect("check").healthy, "the other one is untouched");
        h.driver().destroy(gone).await.expect("destroy of the vanished handle succeeds");
        h.driver().create(gone, &h.spec()).await.expect("made again");
        assert!(h.driver().check(gone).await.expect("check").healthy);
        for id in [gone, kept] {
            h.driver().destroy(id).await.expect("destroy");
        }
    }

    pub(super) async fn a_failed_handle_is_listed_failed_and_checks_unhealthy<H: Harness>() {
        let Some(h) = H::start().await else { return };
        let (failing, fine) = (ResourceId::generate(), ResourceId::generate());
        for id in [failing, fine] {
            h.driver().create(id, &h.spec()).await.expect("create");
        }
        let healthy = h.driver().check(failing).await.expect("check");
        assert!(healthy.healthy, "{healthy:?}");
        h.fail_behind_its_back(failing).await;
        let listed = list(&h).await;
        assert_eq!(ids_of(&listed), sorted(vec![failing, fine]), "a failed handle is still listed: {listed:?}");
        let failed = listed.iter().find(|l| l.id == failing).expect("listed");
        assert!(failed.failed.as_deref().is_some_and(|why| !why.is_empty()), "says why it failed: {failed:?}");
        assert!(listed.iter().find(|l| l.id == fine).expect("listed").failed.is_none(), "{listed:?}");
        let health = h.driver().check(failing).await.expect("check");
        assert!(!health.healthy && !health.detail.is_empty(), "{health:?}");
        assert!(h.driver().check(fine).await.expect("check").healthy);
        h.driver().destroy(failing).await.expect("a failed handle is destroyed like any other");
        assert_eq!(list(&h).await, vec![Listed::present(fine)]);
        h.driver().destroy(fine).await.expect("destroy");
    }

    pub(super) async fn an_unreachable_machine_is_a_transient_error_on_every_call<H: Harness>() {
        let (driver, _keep) = H::unreachable();
        let transient = |what: &str, result: Result<String, DriverError>| match result {
            Err(DriverError::Transient(why)) => assert!(!why.is_empty(), "{what}: says why"),
            other => panic!("{what} on an unreachable machine: {other:?}, not a transient error"),
        };
        let agent = fresh_agent("unreachable");
        // Opening may wait for the machine (a transient error) but must not refuse it for good.
        if let Err(e) = driver.open(&agent).await {
            assert!(matches!(e, DriverError::Transient(_)), "open: {e:?}");
        }
        let id = ResourceId::generate();
        let spec = Spec { kind: "container".into(), order: order(), ..Spec::default() };
        transient("list", driver.list().await.map(|l| format!("{l:?}")));
        transient("create", driver.create(id, &spec).await.map(|n| format!("{n:?}")));
        transient("check", driver.check(id).await.map(|h| format!("{h:?}")));
        transient("destroy", driver.destroy(id).await.map(|()| "done".to_owned()));
    }

    pub(super) async fn a_create_interrupted_half_way_is_finished_by_the_next<H: Harness>() {
        let Some(h) = H::start().await else { return };
        let id = ResourceId::generate();
        h.interrupt_a_create(id).await;
        h.driver().create(id, &h.spec()).await.expect("the next create finishes it");
        assert!(h.exists(id).await);
        assert_eq!(list(&h).await, vec![Listed::present(id)], "one working handle");
        let health = h.driver().check(id).await.expect("check");
        assert!(health.healthy, "{health:?}");
        h.driver().destroy(id).await.expect("destroy");
        assert!(!h.exists(id).await);
    }
}

/// Every case, as one `#[tokio::test]` each, on the harness `$harness`.
macro_rules! conformance {
    ($harness:ty) => {
        use crate::cases;

        #[tokio::test]
        async fn create_twice_is_one_resource() {
            cases::create_twice_is_one_resource::<$harness>().await;
        }

        #[tokio::test]
        async fn destroy_twice_and_destroy_of_the_absent_succeed() {
            cases::destroy_twice_and_destroy_of_the_absent_succeed::<$harness>().await;
        }

        #[tokio::test]
        async fn a_listing_shows_exactly_this_agents_handles() {
            cases::a_listing_shows_exactly_this_agents_handles::<$harness>().await;
        }

        #[tokio::test]
        async fn a_handle_removed_behind_its_back_is_gone_and_unhealthy() {
            cases::a_handle_removed_behind_its_back_is_gone_and_unhealthy::<$harness>().await;
        }

        #[tokio::test]
        async fn a_failed_handle_is_listed_failed_and_checks_unhealthy() {
            cases::a_failed_handle_is_listed_failed_and_checks_unhealthy::<$harness>().await;
        }

        #[tokio::test]
        async fn an_unreachable_machine_is_a_transient_error_on_every_call() {
            cases::an_unreachable_machine_is_a_transient_error_on_every_call::<$harness>().await;
        }

        #[tokio::test]
        async fn a_create_interrupted_half_way_is_finished_by_the_next() {
            cases::a_create_interrupted_half_way_is_finished_by_the_next::<$harness>().await;
        }
    };
}

// ---------------------------------------------------------------------------------------------------------------
// The dir driver: a temporary directory per test.

mod dir {
    use std::path::PathBuf;

    use leasehold_agent::{DirDriver, FAILED_FILE};

    use super::*;

    pub(crate) struct DirHarness {
        tmp: tempfile::TempDir,
        driver: DirDriver,
        /// What [`Harness::make_foreign`] made.
        foreign: std::sync::Mutex<Vec<PathBuf>>,
    }

    impl DirHarness {
        fn other_root(&self) -> PathBuf {
            self.tmp.path().join("other-agent")
        }
    }

    impl Harness for DirHarness {
        type Driver = DirDriver;

        async fn start() -> Option<DirHarness> {
            let tmp = tempfile::tempdir().expect("a temporary directory");
            let driver = DirDriver::new(tmp.path().join("root"));
            driver.open(&fresh_agent("conf")).await.expect("open the root");
            Some(DirHarness { tmp, driver, foreign: Default::default() })
        }

        fn driver(&self) -> &DirDriver {
            &self.driver
        }

        fn spec(&self) -> Spec {
            Spec { kind: "dir".into(), attributes: BTreeMap::new(), claims: BTreeMap::new(), order: order() }
        }

        async fn exists(&self, id: ResourceId) -> bool {
            self.driver.path_of(id).is_dir()
        }

        async fn remove_behind_its_back(&self, id: ResourceId) {
            std::fs::remove_dir_all(self.driver.path_of(id)).expect("remove the directory");
        }

        async fn fail_behind_its_back(&self, id: ResourceId) {
            std::fs::write(self.driver.path_of(id).join(FAILED_FILE), "exit code 3").expect("write the failure");
        }

        async fn make_foreign(&self) -> Vec<ResourceId> {
            // Another agent's root beside this one, with a handle of its own.
            let other = DirDriver::new(self.other_root());
            other.open(&fresh_agent("other")).await.expect("open the other agent's root");
            let theirs = ResourceId::generate();
            other.create(theirs, &self.spec()).await.expect("the other agent's handle");
            // In this root: a directory not named by an id, a file named like an id, an id spelt otherwise.
            let root = self.driver.root();
            std::fs::create_dir(root.join("scratch")).expect("a scratch directory");
            let (file, upper) = (ResourceId::generate(), ResourceId::generate());
            std::fs::write(root.join(file.to_string()), "a file, not a handle").expect("a file");
            std::fs::create_dir(root.join(upper.to_string().to_uppercase())).expect("an upper-case directory");
            let made = [
                other.path_of(theirs),
                root.join("scratch"),
                root.join(file.to_string()),
                root.join(upper.to_string().to_uppercase()),
            ];
            self.foreign.lock().expect("not poisoned").extend(made);
            vec![theirs, file, upper]
        }

        async fn foreign_intact(&self) -> bool {
            self.foreign.lock().expect("not poisoned").iter().all(|path| path.exists())
        }

        async fn interrupt_a_create(&self, id: ResourceId) {
            // A create is one mkdir: what a create that died half-way leaves is the directory, never reported.
            std::fs::create_dir(self.driver.path_of(id)).expect("the directory");
        }

        fn unreachable() -> (DirDriver, Box<dyn std::any::Any>) {
            // A root under a plain file can be neither made nor opened.
            let tmp = tempfile::tempdir().expect("a temporary directory");
            let file = tmp.path().join("a-file");
            std::fs::write(&file, "not a directory").expect("a file");
            (DirDriver::new(file.join("root")), Box::new(tmp))
        }
    }

    conformance!(DirHarness);
}
