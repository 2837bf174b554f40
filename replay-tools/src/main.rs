/// The fold hands many small records from the reading thread to the partitions' threads and back; mimalloc frees
/// them where they were made without the locks of the system allocator's arenas (README, replay's figures).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    leasehold_replay::main()
}
