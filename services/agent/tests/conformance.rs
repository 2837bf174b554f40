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

    /// A driver whose machine cannot be reached at all, and whatever must live as long as it; needs nothing of the
    /// machine itself.
    fn unreachable() -> (Self::Driver, Box<dyn std::any::Any>);

    /// Makes the machine unreachable for the driver already opened (a daemon stopped, a disk unmounted).
    async fn cut_off(&self);
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

    /// Every call of `driver` fails with a transient error that says why: nothing is listed, made, judged or
    /// destroyed.
    async fn every_call_is_transient(driver: &impl Driver, id: ResourceId, spec: &Spec) {
        let transient = |what: &str, result: Result<String, DriverError>| match result {
            Err(DriverError::Transient(why)) => assert!(!why.is_empty(), "{what}: says why"),
            other => panic!("{what} on an unreachable machine: {other:?}, not a transient error"),
        };
        transient("list", driver.list().await.map(|l| format!("{l:?}")));
        transient("create", driver.create(id, spec).await.map(|n| format!("{n:?}")));
        transient("check", driver.check(id).await.map(|h| format!("{h:?}")));
        transient("destroy", driver.destroy(id).await.map(|()| "done".to_owned()));
    }

    pub(super) async fn an_unreachable_machine_is_a_transient_error_on_every_call<H: Harness>() {
        let (driver, _keep) = H::unreachable();
        // Opening waits for the machine (a transient error): it must not refuse it for good.
        match driver.open(&fresh_agent("unreachable")).await {
            Err(DriverError::Transient(_)) => {}
            other => panic!("open of an unreachable machine: {other:?}, not a transient error"),
        }
        let spec = Spec { kind: "container".into(), order: order(), ..Spec::default() };
        every_call_is_transient(&driver, ResourceId::generate(), &spec).await;
    }

    pub(super) async fn a_machine_cut_off_after_open_is_a_transient_error_on_every_call<H: Harness>() {
        let Some(h) = H::start().await else { return };
        let id = ResourceId::generate();
        h.driver().create(id, &h.spec()).await.expect("create");
        assert_eq!(list(&h).await, vec![Listed::present(id)]);
        h.cut_off().await;
        every_call_is_transient(h.driver(), id, &h.spec()).await;
        every_call_is_transient(h.driver(), ResourceId::generate(), &h.spec()).await;
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
        async fn a_machine_cut_off_after_open_is_a_transient_error_on_every_call() {
            cases::a_machine_cut_off_after_open_is_a_transient_error_on_every_call::<$harness>().await;
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

        async fn cut_off(&self) {
            // The root moves away (its disk unmounted): the driver must not make it again, nor list it as empty.
            std::fs::rename(self.driver.root(), self.tmp.path().join("root-away")).expect("move the root away");
        }
    }

    conformance!(DirHarness);
}

// ---------------------------------------------------------------------------------------------------------------
// The docker driver: the real daemon, through a relay socket the test can cut.

#[path = "support/docker_cli.rs"]
mod docker_cli;

mod docker {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::time::Duration;

    use leasehold_agent::docker::{
        DockerDriver, LABEL_AGENT, LABEL_KIND, LABEL_RESOURCE, find_busybox, import_busybox_image,
    };
    use tokio::net::{UnixListener, UnixStream};
    use tokio::task::JoinSet;
    use tokio::time::Instant;

    use super::*;

    use crate::docker_cli::{self, daemon_answers, docker, must};

    /// The label on everything a test makes (the driver's objects through `with_labels`, the foreign ones by hand):
    /// `PID-N`, so a later run removes what a run that died left, and only that.
    const RUN_LABEL: &str = "lh-conformance-run";
    /// How long one `docker` command or one awaited state may take.
    const STEP: Duration = Duration::from_secs(30);

    /// Removes what earlier runs of this suite left behind (their process is gone), once per process.
    async fn remove_leftovers() {
        static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        DONE.get_or_init(|| async {
            let alive = |run: &str| {
                run.split_once('-')
                    .and_then(|(pid, _)| pid.parse::<u32>().ok())
                    .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
            };
            let filter = format!("label={RUN_LABEL}");
            let format = format!("{{{{.Names}}}}\t{{{{.Label \"{RUN_LABEL}\"}}}}");
            let containers = must(&["ps", "-a", "--filter", &filter, "--format", &format]).await;
            for line in containers.lines() {
                if let Some((name, run)) = line.split_once('\t')
                    && !alive(run)
                {
                    let _ = docker(&["rm", "-f", "-v", name]).await;
                }
            }
            let volumes = must(&["volume", "ls", "--filter", &filter, "--format", &format]).await;
            for line in volumes.lines() {
                if let Some((name, run)) = line.split_once('\t')
                    && !alive(run)
                {
                    let _ = docker(&["volume", "rm", "-f", name]).await;
                }
            }
        })
        .await;
    }

    /// The busybox image, imported (never pulled).
    async fn image() -> String {
        let busybox = find_busybox().unwrap_or_else(|e| panic!("the docker cases need a static busybox: {e}"));
        import_busybox_image("", &busybox).await.unwrap_or_else(|e| panic!("import the busybox image: {e}"))
    }

    /// The daemon's socket, as the `docker` command line reaches it.
    fn daemon_socket() -> PathBuf {
        std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|host| host.strip_prefix("unix://").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
    }

    /// A unix socket that passes every connection on to the daemon's, until [`Relay::cut`]: then its connections
    /// close and its path is gone, as a daemon that stopped.
    struct Relay {
        path: PathBuf,
        tasks: JoinSet<()>,
    }

    impl Relay {
        fn start(path: PathBuf) -> Relay {
            let listener = UnixListener::bind(&path).expect("bind the relay socket");
            let daemon = daemon_socket();
            let mut tasks = JoinSet::new();
            tasks.spawn(async move {
                let mut connections = JoinSet::new();
                while let Ok((mut client, _)) = listener.accept().await {
                    let daemon = daemon.clone();
                    connections.spawn(async move {
                        if let Ok(mut upstream) = UnixStream::connect(&daemon).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        }
                    });
                }
            });
            Relay { path, tasks }
        }

        /// Closes every connection and removes the socket.
        fn cut(&mut self) {
            self.tasks.abort_all();
            std::fs::remove_file(&self.path).expect("remove the relay socket");
        }
    }

    pub(crate) struct DockerHarness {
        tmp: tempfile::TempDir,
        agent: AgentName,
        driver: DockerDriver,
        image: String,
        run: String,
        relay: Mutex<Relay>,
        /// The containers and volumes [`Harness::make_foreign`] made.
        foreign: Mutex<Vec<(&'static str, String)>>,
    }

    fn name_of(id: ResourceId) -> String {
        format!("lh-{id}")
    }

    impl DockerHarness {
        fn run_label(&self) -> String {
            format!("{RUN_LABEL}={}", self.run)
        }

        /// Starts a container by hand with `labels` (besides the test run's).
        async fn run_by_hand(&self, name: &str, labels: &[String]) {
            let run_label = self.run_label();
            let mut args = vec!["run", "-d", "--name", name, "--label", &run_label];
            for label in labels {
                args.extend(["--label", label]);
            }
            args.extend([self.image.as_str(), "sleep", "600"]);
            must(&args).await;
        }

        /// Waits until the container's state is `want`.
        async fn wait_state(&self, name: &str, want: &str) {
            let deadline = Instant::now() + STEP;
            loop {
                let state = docker(&["inspect", "--type", "container", "--format", "{{.State.Status}}", name]).await;
                if state.as_deref().map(str::trim) == Ok(want) {
                    return;
                }
                assert!(Instant::now() < deadline, "container {name} is not {want} after {STEP:?}: {state:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    impl Harness for DockerHarness {
        type Driver = DockerDriver;

        async fn start() -> Option<DockerHarness> {
            if !daemon_answers("a docker conformance case").await {
                return None;
            }
            remove_leftovers().await;
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let run = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
            let tmp = tempfile::tempdir().expect("a temporary directory");
            let relay = Relay::start(tmp.path().join("docker.sock"));
            let agent = fresh_agent("conf");
            let driver = DockerDriver::new(&format!("unix://{}", relay.path.display()))
                .expect("a docker endpoint")
                .with_labels(BTreeMap::from([(RUN_LABEL.to_owned(), run.clone())]))
                .with_stop_timeout(Duration::from_secs(1))
                .with_lock_dir(tmp.path().to_owned());
            driver.open(&agent).await.expect("open the driver");
            let image = image().await;
            Some(DockerHarness { tmp, agent, driver, image, run, relay: Mutex::new(relay), foreign: Mutex::default() })
        }

        fn driver(&self) -> &DockerDriver {
            &self.driver
        }

        fn spec(&self) -> Spec {
            let attributes =
                BTreeMap::from([("image".to_owned(), self.image.clone()), ("cmd".to_owned(), "sleep 600".to_owned())]);
            Spec { kind: "container".into(), attributes, claims: BTreeMap::new(), order: order() }
        }

        async fn exists(&self, id: ResourceId) -> bool {
            docker(&["inspect", "--type", "container", &name_of(id)]).await.is_ok()
        }

        async fn remove_behind_its_back(&self, id: ResourceId) {
            must(&["rm", "-f", &name_of(id)]).await;
        }

        async fn fail_behind_its_back(&self, id: ResourceId) {
            must(&["kill", &name_of(id)]).await;
            self.wait_state(&name_of(id), "exited").await;
        }

        async fn make_foreign(&self) -> Vec<ResourceId> {
            let (by_hand, theirs, their_volume) =
                (ResourceId::generate(), ResourceId::generate(), ResourceId::generate());
            let other = fresh_agent("other");
            // Made by hand, named as a handle, without leasehold's labels.
            self.run_by_hand(&name_of(by_hand), &[]).await;
            // Another agent's container and volume.
            let their_labels = |id: ResourceId| {
                vec![
                    format!("{LABEL_AGENT}={other}"),
                    format!("{LABEL_RESOURCE}={id}"),
                    format!("{LABEL_KIND}=container"),
                ]
            };
            self.run_by_hand(&name_of(theirs), &their_labels(theirs)).await;
            let run_label = self.run_label();
            let mut volume = vec!["volume", "create", "--label", &run_label];
            let labels = their_labels(their_volume);
            for label in &labels {
                volume.extend(["--label", label]);
            }
            let volume_name = name_of(their_volume);
            volume.push(&volume_name);
            must(&volume).await;
            // This agent's label on something that names no resource.
            let scratch = format!("lh-scratch-{}", self.run);
            self.run_by_hand(&scratch, &[format!("{LABEL_AGENT}={}", self.agent), format!("{LABEL_RESOURCE}=scratch")])
                .await;
            self.foreign.lock().expect("not poisoned").extend([
                ("container", name_of(by_hand)),
                ("container", name_of(theirs)),
                ("volume", volume_name),
                ("container", scratch),
            ]);
            vec![by_hand, theirs, their_volume]
        }

        async fn foreign_intact(&self) -> bool {
            let foreign = self.foreign.lock().expect("not poisoned").clone();
            for (kind, name) in foreign {
                let format = if kind == "container" { "{{.State.Status}}" } else { "{{.Name}}" };
                match docker(&["inspect", "--type", kind, "--format", format, &name]).await {
                    Ok(state) if kind == "volume" || state.trim() == "running" => {}
                    other => {
                        eprintln!("{kind} {name}: {other:?}");
                        return false;
                    }
                }
            }
            true
        }

        async fn interrupt_a_create(&self, id: ResourceId) {
            // The driver's labels are on the container from its create; the process died before starting it.
            let labels = [
                format!("{LABEL_AGENT}={}", self.agent),
                format!("{LABEL_RESOURCE}={id}"),
                format!("{LABEL_KIND}=container"),
                self.run_label(),
            ];
            let name = name_of(id);
            let mut args = vec!["create", "--name", &name];
            for label in &labels {
                args.extend(["--label", label]);
            }
            args.extend([self.image.as_str(), "sleep", "600"]);
            must(&args).await;
            self.wait_state(&name, "created").await;
        }

        fn unreachable() -> (DockerDriver, Box<dyn std::any::Any>) {
            let tmp = tempfile::tempdir().expect("a temporary directory");
            let endpoint = format!("unix://{}", tmp.path().join("nonexistent.sock").display());
            (DockerDriver::new(&endpoint).expect("a docker endpoint"), Box::new(tmp))
        }

        async fn cut_off(&self) {
            self.relay.lock().expect("not poisoned").cut();
        }
    }

    impl Drop for DockerHarness {
        /// Removes every container and volume the case made, by its test run's label.
        fn drop(&mut self) {
            docker_cli::remove_matching(&format!("label={}", self.run_label()));
            let _ = &self.tmp;
        }
    }

    conformance!(DockerHarness);
}
