//! The docker driver against the machine's real Docker daemon: what it makes, finds, checks and destroys, and what it
//! leaves alone. Nothing is pulled: the one image is imported from the machine's static busybox.
//!
//! Under CI=true a daemon that does not answer (or a missing busybox) fails these tests; otherwise they print why and
//! pass without running.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, NetworkingConfig};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, ListNetworksOptions, ListVolumesOptions,
    RemoveContainerOptions, RemoveVolumeOptions,
};
use leasehold_agent::docker::{
    DockerDriver, LABEL_AGENT, LABEL_EPOCH, LABEL_KIND, LABEL_NETWORK_POOL, LABEL_ORDER, LABEL_RESOURCE, find_busybox,
    import_busybox_image,
};
use leasehold_agent::{Claimed, CreateOrder, Driver, DriverError, Listed, Spec};
use leasehold_schemas::ids::AgentName;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::{Position, ResourceId};

const TEST_RUN: &str = "io.leasehold.test-run";

/// This process's test run: the label every object of it carries.
fn run_id() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| uuid::Uuid::now_v7().to_string())
}

/// The busybox image's tag, once per process (with earlier runs' leftovers removed first); `None` when the daemon
/// does not answer and CI is not set.
async fn image() -> Option<String> {
    static IMAGE: tokio::sync::OnceCell<Option<String>> = tokio::sync::OnceCell::const_new();
    IMAGE
        .get_or_init(|| async {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            let unavailable = |why: String| {
                assert!(!ci, "CI=true and the docker tests cannot run: {why}");
                eprintln!("skipping the docker driver tests: {why}");
                None
            };
            let busybox = match find_busybox() {
                Ok(busybox) => busybox,
                Err(why) => return unavailable(why),
            };
            let docker = match Docker::connect_with_local_defaults() {
                Ok(docker) => docker,
                Err(e) => return unavailable(format!("no docker daemon: {e}")),
            };
            let docker = match docker.negotiate_version().await {
                Ok(docker) => docker,
                Err(e) => return unavailable(format!("the docker daemon does not answer: {e}")),
            };
            remove_leftovers(&docker).await;
            // The daemon answers: an image it cannot import is a failure, CI or not.
            Some(import_busybox_image("", &busybox).await.expect("the busybox image is imported"))
        })
        .await
        .clone()
}

async fn client() -> Docker {
    Docker::connect_with_local_defaults().unwrap().negotiate_version().await.unwrap()
}

/// Removes what earlier runs left: their containers and volumes (test-run label, made by a test agent `t-...` or by
/// hand without an agent label) and their networks (`lh-test-...`, unless a container still uses one). Other test
/// processes may share the daemon, so a run's objects count as left over only once its run id (a UUIDv7, which holds
/// its time) is 10 minutes old.
async fn remove_leftovers(docker: &Docker) {
    let stale = |run: &str| {
        let started = uuid::Uuid::parse_str(run).ok().and_then(|run| run.get_timestamp()).map(|t| t.to_unix().0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        started.is_none_or(|started| started + 600 < now)
    };
    let earlier = |labels: Option<&HashMap<String, String>>| {
        labels.is_some_and(|labels| {
            labels.get(TEST_RUN).is_some_and(|run| run != run_id() && stale(run))
                && labels.get(LABEL_AGENT).is_none_or(|agent| agent.starts_with("t-"))
        })
    };
    let filters = HashMap::from([("label".to_owned(), vec![TEST_RUN.to_owned()])]);
    let containers = ListContainersOptions { all: true, filters: Some(filters.clone()), ..Default::default() };
    for container in docker.list_containers(Some(containers)).await.unwrap() {
        if earlier(container.labels.as_ref()) {
            let remove = RemoveContainerOptions { force: true, v: true, link: false };
            let _ = docker.remove_container(&container.id.unwrap(), Some(remove)).await;
        }
    }
    let volumes = docker.list_volumes(Some(ListVolumesOptions { filters: Some(filters) })).await.unwrap();
    for volume in volumes.volumes.unwrap_or_default() {
        if earlier(Some(&volume.labels)) {
            let _ = docker.remove_volume(&volume.name, None::<RemoveVolumeOptions>).await;
        }
    }
    for network in docker.list_networks(None::<ListNetworksOptions>).await.unwrap() {
        let made_by_a_run = network.labels.as_ref().and_then(|labels| labels.get(TEST_RUN));
        let stale_network = made_by_a_run.is_none_or(|run| run != run_id() && stale(run));
        if network.name.as_deref().is_some_and(|name| name.starts_with("lh-test-")) && stale_network {
            let _ = docker.remove_network(network.name.as_deref().unwrap()).await;
        }
    }
}

/// An agent name of its own for each test.
fn agent_name(what: &str) -> AgentName {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    AgentName::new(format!("t-{}-{}-{what}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst))).unwrap()
}

fn new_id() -> ResourceId {
    ResourceId::new(uuid::Uuid::now_v7()).unwrap()
}

/// A driver for the local daemon with this run's label, a short stop (busybox's `sleep` as PID 1 ignores SIGTERM, so
/// every stop waits it out) and `locks` for lock files.
fn driver(locks: &std::path::Path) -> DockerDriver {
    DockerDriver::new("")
        .unwrap()
        .with_labels(BTreeMap::from([(TEST_RUN.to_owned(), run_id().to_owned())]))
        .with_stop_timeout(Duration::from_secs(1))
        .with_lock_dir(locks.to_path_buf())
}

async fn opened(what: &str) -> (DockerDriver, AgentName, tempfile::TempDir) {
    let locks = tempfile::tempdir().unwrap();
    let agent = agent_name(what);
    let driver = driver(locks.path());
    driver.open(&agent).await.unwrap();
    (driver, agent, locks)
}

fn container(image: &str, cmd: &str) -> Spec {
    Spec {
        kind: "container".to_owned(),
        attributes: BTreeMap::from([("image".to_owned(), image.to_owned()), ("cmd".to_owned(), cmd.to_owned())]),
        order: Some(CreateOrder { epoch: Position(7), position: Position(42) }),
        ..Spec::default()
    }
}

async fn inspect(docker: &Docker, name: &str) -> Option<bollard::models::ContainerInspectResponse> {
    docker.inspect_container(name, None::<InspectContainerOptions>).await.ok()
}

/// Makes a container by hand named `name` with `labels` (and this run's), running `sleep 600`.
async fn make_by_hand(docker: &Docker, image: &str, name: &str, labels: &[(&str, String)], binds: Vec<String>) {
    let mut all: HashMap<String, String> = labels.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    all.insert(TEST_RUN.to_owned(), run_id().to_owned());
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(vec!["sleep".to_owned(), "600".to_owned()]),
        labels: Some(all),
        host_config: Some(HostConfig { binds: Some(binds), ..Default::default() }),
        ..Default::default()
    };
    let options = CreateContainerOptions { name: Some(name.to_owned()), ..Default::default() };
    docker.create_container(Some(options), body).await.unwrap();
    docker.start_container(name, None).await.unwrap();
}

async fn remove_by_hand(docker: &Docker, name: &str) {
    let remove = RemoveContainerOptions { force: true, v: true, link: false };
    docker.remove_container(name, Some(remove)).await.unwrap();
}

/// Polls `listing` until `done` holds of it, for at most 30 s.
async fn list_until(driver: &DockerDriver, done: impl Fn(&[Listed]) -> bool) -> Vec<Listed> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed = driver.list().await.unwrap();
        if done(&listed) {
            return listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "the listing never got there: {listed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_container_is_made_once_listed_checked_and_destroyed_and_no_other_is_touched() {
    let Some(image) = image().await else { return };
    let docker = client().await;
    let (driver, agent, _locks) = opened("life").await;
    let id = new_id();
    let spec = container(&image, "sleep 600");
    let native = driver.create(id, &spec).await.unwrap().expect("a container id");
    assert_eq!(driver.create(id, &spec).await.unwrap(), Some(native.clone()), "a second create finds the first");
    let found = inspect(&docker, &format!("lh-{id}")).await.unwrap();
    assert_eq!(found.id.as_deref(), Some(native.as_str()));
    let labels = found.config.unwrap().labels.unwrap();
    for (label, value) in [
        (LABEL_AGENT, agent.to_string()),
        (LABEL_RESOURCE, id.to_string()),
        (LABEL_KIND, "container".to_owned()),
        (LABEL_EPOCH, Position(7).to_string()),
        (LABEL_ORDER, Position(42).to_string()),
        (TEST_RUN, run_id().to_owned()),
    ] {
        assert_eq!(labels.get(label), Some(&value), "{label}");
    }
    let restart = found.host_config.unwrap().restart_policy.unwrap().name.unwrap();
    assert_eq!(restart.to_string(), "no");

    // Two containers of resource names that are not this agent's: one made by hand, one of another agent.
    let (by_hand, others) = (new_id(), new_id());
    make_by_hand(&docker, &image, &format!("lh-{by_hand}"), &[(LABEL_RESOURCE, by_hand.to_string())], vec![]).await;
    let other_agent = agent_name("other");
    let other_labels = [(LABEL_AGENT, other_agent.to_string()), (LABEL_RESOURCE, others.to_string())];
    make_by_hand(&docker, &image, &format!("lh-{others}"), &other_labels, vec![]).await;

    assert_eq!(driver.list().await.unwrap(), vec![Listed::present(id)]);
    let health = driver.check(id).await.unwrap();
    assert!(health.healthy, "{health:?}");
    for foreign in [by_hand, others] {
        driver.destroy(foreign).await.unwrap();
        assert!(inspect(&docker, &format!("lh-{foreign}")).await.is_some(), "{foreign} was left alone");
        assert!(!driver.check(foreign).await.unwrap().healthy);
    }
    let err = driver.create(by_hand, &container(&image, "sleep 600")).await.unwrap_err();
    assert!(
        matches!(&err, DriverError::CreateFailed(why) if why.contains("exists that agent") && why.contains("did not make")),
        "{err}"
    );

    driver.destroy(id).await.unwrap();
    driver.destroy(id).await.unwrap();
    assert!(inspect(&docker, &format!("lh-{id}")).await.is_none());
    assert_eq!(driver.list().await.unwrap(), vec![]);
    assert_eq!(driver.check(id).await.unwrap().detail, "absent");
    for foreign in [by_hand, others] {
        remove_by_hand(&docker, &format!("lh-{foreign}")).await;
    }
}

#[tokio::test]
async fn a_container_that_exits_is_listed_failed_and_checks_unhealthy() {
    let Some(image) = image().await else { return };
    let (driver, _agent, _locks) = opened("exit").await;
    let id = new_id();
    driver.create(id, &container(&image, "false")).await.unwrap();
    let listed = list_until(&driver, |listed| listed.iter().any(|l| l.id == id && l.failed.is_some())).await;
    let failed = listed[0].failed.clone().unwrap();
    assert!(failed.starts_with(&format!("container lh-{id} exited with code 1 at ")), "{failed}");
    let health = driver.check(id).await.unwrap();
    assert!(!health.healthy && health.detail.contains("exited with code 1"), "{health:?}");
    // Create again is still done (it exists); it does not start it again.
    driver.create(id, &container(&image, "false")).await.unwrap();
    driver.destroy(id).await.unwrap();
    assert_eq!(driver.list().await.unwrap(), vec![]);

    // A command that does not exist: the start fails for good, and the container left behind lists as failed.
    let never = new_id();
    let err = driver.create(never, &container(&image, "/no/such/program")).await.unwrap_err();
    assert!(matches!(&err, DriverError::CreateFailed(why) if why.contains("/no/such/program")), "{err}");
    let listed = driver.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let failed = listed[0].failed.clone().unwrap_or_default();
    assert!(failed.starts_with(&format!("container lh-{never} could not start: ")), "{listed:?}");
    assert!(!driver.check(never).await.unwrap().healthy);
    driver.destroy(never).await.unwrap();
    assert_eq!(driver.list().await.unwrap(), vec![]);
}

#[tokio::test]
async fn what_cannot_be_made_fails_for_good() {
    let Some(image) = image().await else { return };
    let (driver, _agent, _locks) = opened("bad").await;
    let failed = |result: Result<Option<String>, DriverError>| match result {
        Err(DriverError::CreateFailed(why)) => why,
        other => panic!("not a definitive failure: {other:?}"),
    };
    let why = failed(driver.create(new_id(), &container("leasehold-no-such-image:1", "true")).await);
    assert!(why.contains("image leasehold-no-such-image:1 is not on this machine; leasehold never pulls"), "{why}");
    let mut spec = container(&image, "true");
    spec.attributes.insert("ports".to_owned(), "80".to_owned());
    assert!(failed(driver.create(new_id(), &spec).await).contains("no attribute \"ports\""));
    let env_dir = tempfile::tempdir().unwrap();
    let with_env_dir = driver.clone().with_env_file_dir(env_dir.path()).unwrap();
    let mut spec = container(&image, "true");
    spec.attributes.insert("env-file".to_owned(), "leasehold.env".to_owned());
    assert!(failed(with_env_dir.create(new_id(), &spec).await).contains("no such file"));
    let vm = Spec { kind: "vm".to_owned(), ..Spec::default() };
    assert!(failed(driver.create(new_id(), &vm).await).contains("known kinds are container, volume"));
    assert_eq!(driver.list().await.unwrap(), vec![], "nothing was left behind");
}

#[tokio::test]
async fn env_attributes_and_files_reach_the_container() {
    let Some(image) = image().await else { return };
    let docker = client().await;
    let (driver, _agent, _locks) = opened("env").await;
    let dir = tempfile::tempdir().unwrap();
    let driver = driver.with_env_file_dir(dir.path()).unwrap();
    std::fs::create_dir(dir.path().join("apps")).unwrap();
    std::fs::write(dir.path().join("apps/app.env"), "# the app\nFROM_FILE=yes\nBOTH=file\n").unwrap();
    let id = new_id();
    let mut spec = container(&image, "sleep 600");
    spec.attributes.insert("env.BOTH".to_owned(), "attribute".to_owned());
    spec.attributes.insert("env-file".to_owned(), "apps/app.env".to_owned());
    spec.attributes.insert("memory".to_owned(), "64m".to_owned());
    driver.create(id, &spec).await.unwrap();
    let found = inspect(&docker, &format!("lh-{id}")).await.unwrap();
    let env = found.config.unwrap().env.unwrap();
    assert!(env.contains(&"FROM_FILE=yes".to_owned()), "{env:?}");
    let both: Vec<&String> = env.iter().filter(|e| e.starts_with("BOTH=")).collect();
    assert_eq!(both.last().map(|s| s.as_str()), Some("BOTH=attribute"), "the attribute is later, so it wins");
    assert_eq!(found.host_config.unwrap().memory, Some(64 << 20));
    driver.destroy(id).await.unwrap();
}

/// `env-file` is a producer's attribute read on the agent's machine: without a directory the operator named, no file
/// is read at all, and with one, nothing outside it (`..`, an absolute path, a symlink that leads out) is.
#[tokio::test]
async fn an_env_file_is_read_only_from_the_directory_the_agent_was_given() {
    let Some(image) = image().await else { return };
    let (driver, _agent, _locks) = opened("envdir").await;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("agent.creds");
    std::fs::write(&secret, "NATS_SECRET=agent-creds\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.env"), "A=1\n").unwrap();
    std::os::unix::fs::symlink(&secret, dir.path().join("leak.env")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
    let refused = |result: Result<Option<String>, DriverError>| match result {
        Err(DriverError::CreateFailed(why)) => why,
        other => panic!("not refused for good: {other:?}"),
    };
    let with_file = |path: &str| {
        let mut spec = container(&image, "sleep 600");
        spec.attributes.insert("env-file".to_owned(), path.to_owned());
        spec
    };
    // Started without --env-file-dir: no env file at all, not even one that exists.
    for path in [secret.display().to_string(), "ok.env".to_owned()] {
        let why = refused(driver.create(new_id(), &with_file(&path)).await);
        assert!(why.contains("--env-file-dir"), "{path}: {why}");
    }
    let driver = driver.with_env_file_dir(dir.path()).unwrap();
    let escapes = [
        secret.display().to_string(),
        "/etc/shadow".to_owned(),
        format!("../{}/agent.creds", outside.path().file_name().unwrap().to_str().unwrap()),
        "leak.env".to_owned(),
        "out/agent.creds".to_owned(),
        "".to_owned(),
    ];
    for path in escapes {
        let why = refused(driver.create(new_id(), &with_file(&path)).await);
        assert!(why.contains("env-file") && !why.contains("agent-creds"), "{path}: {why}");
    }
    assert_eq!(driver.list().await.unwrap(), vec![], "nothing was made from a file outside the directory");
    let id = new_id();
    driver.create(id, &with_file("ok.env")).await.unwrap();
    driver.destroy(id).await.unwrap();
    let missing = driver.clone().with_env_file_dir(&dir.path().join("missing"));
    assert!(missing.unwrap_err().contains("missing"), "a directory that is not there is refused at start");
}

#[tokio::test]
async fn a_volume_in_use_is_not_destroyed_until_its_user_is_gone() {
    let Some(image) = image().await else { return };
    let docker = client().await;
    let (driver, _agent, _locks) = opened("vol").await;
    let id = new_id();
    let volume = Spec { kind: "volume".to_owned(), ..Spec::default() };
    let name = format!("lh-{id}");
    assert_eq!(driver.create(id, &volume).await.unwrap(), Some(name.clone()));
    assert_eq!(driver.create(id, &volume).await.unwrap(), Some(name.clone()));
    assert_eq!(driver.list().await.unwrap(), vec![Listed::present(id)]);
    assert!(driver.check(id).await.unwrap().healthy);
    let user = format!("lh-test-user-{id}");
    make_by_hand(&docker, &image, &user, &[], vec![format!("{name}:/data")]).await;
    let err = driver.destroy(id).await.unwrap_err();
    assert!(matches!(&err, DriverError::InUse(why) if why.contains(&user)), "{err}");
    remove_by_hand(&docker, &user).await;
    driver.destroy(id).await.unwrap();
    driver.destroy(id).await.unwrap();
    assert_eq!(driver.list().await.unwrap(), vec![]);
    assert_eq!(driver.check(id).await.unwrap().detail, "absent");
}

#[tokio::test]
async fn a_pool_address_is_the_containers_address_on_its_network() {
    let Some(image) = image().await else { return };
    let docker = client().await;
    let (driver, agent, _locks) = opened("net").await;
    let network = format!("lh-test-{}", std::process::id());
    // A /29 of its own per process, in a range Docker does not hand out by default.
    let third = u8::try_from(std::process::id() % 250).unwrap();
    let base = Ipv4Addr::new(10, 213, third, 0);
    let pool = PoolKind::Ipv4 { network: base, prefix_len: 29, exclude: vec![Ipv4Addr::new(10, 213, third, 1)] };
    let granted = Ipv4Addr::new(10, 213, third, 3);
    let mut spec = container(&image, "sleep 600");
    spec.attributes.insert("network".to_owned(), network.clone());
    spec.claims.insert("net1".parse().unwrap(), Claimed { value: PoolValue::Ipv4(granted), pool: Some(pool) });
    let id = new_id();
    driver.create(id, &spec).await.unwrap();
    let found = inspect(&docker, &format!("lh-{id}")).await.unwrap();
    let networks = found.network_settings.unwrap().networks.unwrap();
    let on = networks.get(&network).expect("on the pool's network");
    assert_eq!(on.ip_address.as_deref(), Some(granted.to_string().as_str()));
    assert_eq!(on.ipam_config.as_ref().unwrap().ipv4_address.as_deref(), Some(granted.to_string().as_str()));
    let made = docker.inspect_network(&network, None).await.unwrap();
    let labels = made.labels.unwrap();
    assert_eq!(labels.get(LABEL_AGENT), Some(&agent.to_string()));
    assert_eq!(labels.get(LABEL_NETWORK_POOL).map(String::as_str), Some("net1"));
    let ipam = &made.ipam.unwrap().config.unwrap()[0];
    assert_eq!(ipam.subnet.as_deref(), Some(format!("{base}/29").as_str()));
    assert_eq!(ipam.gateway.as_deref(), Some(format!("10.213.{third}.1").as_str()));

    // A second container on the same network (it exists now) at another address; a pool that hands out the
    // network's gateway is refused.
    let second = new_id();
    let mut other = spec.clone();
    other.claims.insert(
        "net1".parse().unwrap(),
        Claimed {
            value: PoolValue::Ipv4(Ipv4Addr::new(10, 213, third, 4)),
            pool: Some(PoolKind::Ipv4 { network: base, prefix_len: 29, exclude: vec![] }),
        },
    );
    let err = driver.create(second, &other).await.unwrap_err();
    assert!(
        matches!(&err, DriverError::CreateFailed(why) if why.contains(&format!("includes 10.213.{third}.1, the gateway of docker network {network}"))),
        "{err}"
    );
    driver.destroy(id).await.unwrap();
    assert!(docker.inspect_network(&network, None).await.is_ok(), "the agent never deletes networks");
    docker.remove_network(&network).await.unwrap();
}

/// An address of the pool that a container leasehold did not make holds already (someone ran `docker run --ip`): the
/// create fails for good naming that container, and nothing is made, rather than a 500 at the start, retried.
#[tokio::test]
async fn a_pool_address_held_by_a_container_made_by_hand_fails_the_create_naming_it() {
    let Some(image) = image().await else { return };
    let docker = client().await;
    let (driver, _agent, _locks) = opened("held").await;
    let network = format!("lh-test-held-{}", std::process::id());
    let third = u8::try_from(std::process::id() % 250).unwrap();
    let pool = PoolKind::Ipv4 {
        network: Ipv4Addr::new(10, 215, third, 0),
        prefix_len: 29,
        exclude: vec![Ipv4Addr::new(10, 215, third, 1)],
    };
    let on_network = |last: u8| {
        let mut spec = container(&image, "sleep 600");
        spec.attributes.insert("network".to_owned(), network.clone());
        let value = PoolValue::Ipv4(Ipv4Addr::new(10, 215, third, last));
        spec.claims.insert("net3".parse().unwrap(), Claimed { value, pool: Some(pool.clone()) });
        spec
    };
    let first = new_id();
    driver.create(first, &on_network(2)).await.unwrap();
    let squatter = format!("lh-test-squatter-{}", std::process::id());
    let endpoint = EndpointSettings {
        ipam_config: Some(EndpointIpamConfig { ipv4_address: Some(format!("10.215.{third}.3")), ..Default::default() }),
        ..Default::default()
    };
    let body = ContainerCreateBody {
        image: Some(image.clone()),
        cmd: Some(vec!["sleep".to_owned(), "600".to_owned()]),
        labels: Some(HashMap::from([(TEST_RUN.to_owned(), run_id().to_owned())])),
        host_config: Some(HostConfig { network_mode: Some(network.clone()), ..Default::default() }),
        networking_config: Some(NetworkingConfig {
            endpoints_config: Some(HashMap::from([(network.clone(), endpoint)])),
        }),
        ..Default::default()
    };
    let options = CreateContainerOptions { name: Some(squatter.clone()), ..Default::default() };
    docker.create_container(Some(options), body).await.unwrap();
    docker.start_container(&squatter, None).await.unwrap();

    let second = new_id();
    let result = driver.create(second, &on_network(3)).await;
    let made = inspect(&docker, &format!("lh-{second}")).await.is_some();
    driver.destroy(second).await.unwrap();
    driver.destroy(first).await.unwrap();
    remove_by_hand(&docker, &squatter).await;
    docker.remove_network(&network).await.unwrap();
    match result {
        Err(DriverError::CreateFailed(why)) => assert!(
            why.contains(&format!("10.215.{third}.3")) && why.contains(&squatter) && why.contains("did not"),
            "{why}"
        ),
        other => panic!("not a failure for good naming the holder: {other:?}"),
    }
    assert!(!made, "nothing was made");
}

#[tokio::test]
async fn two_creates_racing_for_a_missing_network_both_get_their_address() {
    let Some(image) = image().await else { return };
    let docker = client().await;
    let (driver, _agent, _locks) = opened("race").await;
    let network = format!("lh-test-race-{}", std::process::id());
    let third = u8::try_from(std::process::id() % 250).unwrap();
    let pool = PoolKind::Ipv4 {
        network: Ipv4Addr::new(10, 214, third, 0),
        prefix_len: 29,
        exclude: vec![Ipv4Addr::new(10, 214, third, 1)],
    };
    let on_network = |last: u8| {
        let mut spec = container(&image, "sleep 600");
        spec.attributes.insert("network".to_owned(), network.clone());
        let value = PoolValue::Ipv4(Ipv4Addr::new(10, 214, third, last));
        spec.claims.insert("net2".parse().unwrap(), Claimed { value, pool: Some(pool.clone()) });
        spec
    };
    let (first, second) = (new_id(), new_id());
    let (one, two) = (on_network(2), on_network(3));
    let (made_first, made_second) = tokio::join!(driver.create(first, &one), driver.create(second, &two));
    made_first.unwrap();
    made_second.unwrap();
    for (id, last) in [(first, 2), (second, 3)] {
        let found = inspect(&docker, &format!("lh-{id}")).await.unwrap();
        let networks = found.network_settings.unwrap().networks.unwrap();
        let address = networks.get(&network).and_then(|on| on.ip_address.clone());
        assert_eq!(address, Some(format!("10.214.{third}.{last}")));
    }
    driver.destroy(first).await.unwrap();
    driver.destroy(second).await.unwrap();
    docker.remove_network(&network).await.unwrap();
}

#[tokio::test]
async fn a_second_process_of_an_agent_on_a_daemon_is_refused() {
    let Some(_image) = image().await else { return };
    let (first, agent, locks) = opened("lock").await;
    let err = driver(locks.path()).open(&agent).await.unwrap_err();
    assert!(
        matches!(&err, DriverError::Refused(why) if why.contains(&format!("another process of agent {agent}")) && why.contains("leasehold-docker-")),
        "{err}"
    );
    driver(locks.path()).open(&agent_name("lock2")).await.expect("another agent on the same daemon");
    drop(first);
    driver(locks.path()).open(&agent).await.expect("once the first let go");
}

/// The lock file's directory is the temporary directory by default, where anyone may put a symlink of the lock
/// file's name: opening it must not create or open the file it points at (the agent often runs as root).
#[tokio::test]
async fn a_lock_file_that_is_a_symlink_is_refused_and_its_target_not_made() {
    let Some(_image) = image().await else { return };
    let docker = client().await;
    let daemon = docker.info().await.unwrap().id.unwrap();
    let daemon: String =
        daemon.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    let (locks, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let agent = agent_name("symlink");
    let target = elsewhere.path().join("nologin");
    std::os::unix::fs::symlink(&target, locks.path().join(format!("leasehold-docker-{daemon}-{agent}.lock"))).unwrap();
    let err = driver(locks.path()).open(&agent).await.unwrap_err();
    assert!(!target.exists(), "the symlink's target was created: {err}");
    assert!(matches!(&err, DriverError::Refused(why) if why.contains("not a regular file")), "{err}");
}

#[tokio::test]
async fn an_unopened_driver_or_an_absent_daemon_makes_and_lists_nothing() {
    let locks = tempfile::tempdir().unwrap();
    let err = driver(locks.path()).list().await.unwrap_err();
    assert!(matches!(&err, DriverError::Transient(why) if why.contains("not opened")), "{err}");
    let absent = DockerDriver::new("unix:///nonexistent/docker.sock").unwrap().with_lock_dir(locks.path().into());
    let err = absent.open(&agent_name("absent")).await.unwrap_err();
    assert!(matches!(&err, DriverError::Transient(why) if why.contains("unix:///nonexistent/docker.sock")), "{err}");
}
