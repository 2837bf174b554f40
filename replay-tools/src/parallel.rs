//! Work spread over the machine's cores: the partitions of a batch of the log (`verify`), the outcomes of a batch
//! to decode (`rebuild`). Scoped threads per batch: a batch is milliseconds of work, a thread's start microseconds.

/// Runs `f` on every item on up to `threads` threads (this one and scoped others), items spread so that each
/// thread gets about as many; answers the results in the items' order.
pub fn on_threads<T: Send + Weighed, R: Send>(items: Vec<T>, threads: usize, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let n = items.len();
    let threads = threads.clamp(1, n.max(1));
    // The heaviest items first, each to the thread with the least so far.
    let mut order: Vec<(usize, T)> = items.into_iter().enumerate().collect();
    order.sort_by_key(|(_, item)| std::cmp::Reverse(item.weight()));
    let mut groups: Vec<(usize, Vec<(usize, T)>)> = (0..threads).map(|_| (0, Vec::new())).collect();
    for (i, item) in order {
        let group = groups.iter_mut().min_by_key(|(load, _)| *load).expect("at least one thread");
        group.0 += item.weight() + 1;
        group.1.push((i, item));
    }
    let f = &f;
    let run = move |group: Vec<(usize, T)>| group.into_iter().map(|(i, item)| (i, f(item))).collect::<Vec<_>>();
    let mut groups = groups.into_iter().map(|(_, group)| group);
    let here = groups.next().unwrap_or_default();
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let others: Vec<_> = groups.map(|group| scope.spawn(move || run(group))).collect();
        let mut done = run(here);
        for other in others {
            match other.join() {
                Ok(results) => done.extend(results),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        done
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// How much work an item is, to spread items over threads.
pub trait Weighed {
    fn weight(&self) -> usize;
}

impl<T> Weighed for Vec<T> {
    fn weight(&self) -> usize {
        self.len()
    }
}
