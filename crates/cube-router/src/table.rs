//! The routes as the router uses them: by host and by name, each with its copies and how
//! many requests each has outstanding. Built whole from `GET /routes` on every change; a
//! copy still in the new table keeps its counter (and a route its turn), so that a change
//! does not reset the balance.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cube_types::route::RouteView;
use uuid::Uuid;

/// One copy of a route, with the requests the router has sent it and not yet seen answered.
#[derive(Debug)]
pub struct Target {
    /// `HOST:PORT`, where the copy's node publishes the route's port.
    pub address: String,
    /// The task.
    pub id: Uuid,
    pub name: String,
    pub node: String,
    outstanding: AtomicUsize,
}

impl Target {
    pub fn new(address: String, id: Uuid, name: String, node: String) -> Target {
        Target {
            address,
            id,
            name,
            node,
            outstanding: AtomicUsize::new(0),
        }
    }

    /// Requests sent to it and not answered yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }
}

/// A copy chosen for one request: counted outstanding until dropped.
#[derive(Debug)]
pub struct Pick {
    target: Arc<Target>,
}

impl Pick {
    fn new(target: Arc<Target>) -> Pick {
        target.outstanding.fetch_add(1, Ordering::Relaxed);
        Pick { target }
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }
}

impl std::ops::Deref for Pick {
    type Target = Target;

    fn deref(&self) -> &Target {
        &self.target
    }
}

impl Drop for Pick {
    fn drop(&mut self) {
        self.target.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One route: the host it answers for and its copies.
#[derive(Debug)]
pub struct Route {
    /// The route's name as the manager gives it (`web.shop`, or its declared host).
    pub name: String,
    /// The host requests arrive for.
    pub host: String,
    pub project: String,
    /// The container port, `"7777/tcp"`.
    pub port: String,
    pub targets: Vec<Arc<Target>>,
    /// Where the next tie among the least loaded copies is broken: copies answer in turn.
    turn: Arc<AtomicUsize>,
}

impl Route {
    /// The copy with the fewest requests outstanding, ties taken in turn; `avoid` (a copy
    /// that just failed) only when it is the only one. One pass from a turning start, with no
    /// allocation; the counts are read once each, as other requests change them meanwhile.
    pub fn pick(&self, avoid: Option<&Target>) -> Option<Pick> {
        let count = self.targets.len();
        if count == 0 {
            return None;
        }
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(&Arc<Target>, usize)> = None;
        let mut avoided = None;
        for offset in 0..count {
            let target = &self.targets[(start + offset) % count];
            if avoid.is_some_and(|avoid| std::ptr::eq(&**target, avoid)) {
                avoided = Some(target);
                continue;
            }
            let load = target.outstanding();
            if best.is_none_or(|(_, least)| load < least) {
                best = Some((target, load));
            }
        }
        let chosen = best.map(|(target, _)| target).or(avoided)?;
        Some(Pick::new(Arc::clone(chosen)))
    }
}

/// Every route, by host and by name.
#[derive(Debug, Default)]
pub struct RouteTable {
    by_host: HashMap<String, Arc<Route>>,
    by_name: HashMap<String, Arc<Route>>,
    /// Routes left out because an earlier one (by project, then name) has their host.
    pub conflicts: Vec<String>,
}

impl RouteTable {
    /// The table of `routes` under `domain`, keeping the counters of `previous`'s copies.
    pub fn build(routes: &[RouteView], domain: &str, previous: Option<&RouteTable>) -> RouteTable {
        let mut known: HashMap<(&str, Uuid), &Arc<Target>> = HashMap::new();
        let mut turns: HashMap<&str, &Arc<AtomicUsize>> = HashMap::new();
        if let Some(previous) = previous {
            for route in previous.by_host.values() {
                turns.insert(route.host.as_str(), &route.turn);
                for target in &route.targets {
                    known.insert((target.address.as_str(), target.id), target);
                }
            }
        }
        let mut sorted: Vec<&RouteView> = routes.iter().collect();
        sorted.sort_by(|a, b| (&a.project, &a.name).cmp(&(&b.project, &b.name)));
        let mut table = RouteTable::default();
        for view in sorted {
            let host = normalized_host(&view.host_under(domain));
            if table.by_host.contains_key(&host) {
                table.conflicts.push(format!(
                    "route {} of project {} wants host {host}, which an earlier route has",
                    view.name, view.project
                ));
                continue;
            }
            let targets = view
                .backends
                .iter()
                .map(|backend| {
                    known
                        .get(&(backend.address.as_str(), backend.id))
                        .map(|target| Arc::clone(target))
                        .unwrap_or_else(|| {
                            Arc::new(Target::new(
                                backend.address.clone(),
                                backend.id,
                                backend.name.clone(),
                                backend.node.clone(),
                            ))
                        })
                })
                .collect();
            let turn = turns
                .get(host.as_str())
                .map(|turn| Arc::clone(turn))
                .unwrap_or_default();
            let route = Arc::new(Route {
                name: view.name.clone(),
                host: host.clone(),
                project: view.project.clone(),
                port: view.port.clone(),
                targets,
                turn,
            });
            table.by_name.insert(view.name.clone(), Arc::clone(&route));
            table.by_host.insert(host, route);
        }
        table
    }

    /// The route for a request's `Host` (any case, with or without a port or a final dot).
    pub fn by_host(&self, host: &str) -> Option<&Arc<Route>> {
        self.by_host.get(&normalized_host(host))
    }

    /// The route by its name (`web.shop`) or its host.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name).or_else(|| self.by_host(name))
    }

    /// Every route, by host.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.by_host.values()
    }

    pub fn len(&self) -> usize {
        self.by_host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_host.is_empty()
    }
}

/// A `Host` header's host: lowercase, without its port or a final dot.
pub fn normalized_host(host: &str) -> String {
    let host = host.trim();
    let host = if host.starts_with('[') {
        // An IPv6 literal: `[::1]:80`.
        host.split_once(']')
            .map_or(host, |(inside, _)| inside.trim_start_matches('['))
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::route::Backend;

    fn view(name: &str, host: &str, backends: &[(&str, u128)]) -> RouteView {
        RouteView {
            name: name.into(),
            host: host.into(),
            project: "default".into(),
            job: "shop".into(),
            group: "web".into(),
            port: "7777/tcp".into(),
            backends: backends
                .iter()
                .map(|(address, id)| Backend {
                    address: address.to_string(),
                    id: Uuid::from_u128(*id),
                    name: format!("copy-{id}"),
                    node: "w1".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn hosts_are_found_in_any_case_with_or_without_a_port() {
        let table = RouteTable::build(
            &[view("web.shop", "", &[("127.0.0.1:1", 1)])],
            "example.test",
            None,
        );
        for host in [
            "web.shop.example.test",
            "WEB.shop.example.test:80",
            "web.shop.example.test.",
        ] {
            assert!(table.by_host(host).is_some(), "{host}");
        }
        assert!(table.by_host("other.example.test").is_none());
        assert!(table.by_name("web.shop").is_some());
        assert_eq!(normalized_host("[::1]:80"), "::1");
    }

    #[test]
    fn copies_answer_in_turn_and_the_least_loaded_goes_first() {
        let table = RouteTable::build(
            &[view("web.shop", "", &[("a:1", 1), ("b:1", 2), ("c:1", 3)])],
            "example.test",
            None,
        );
        let route = table.by_name("web.shop").unwrap();
        let mut seen: Vec<String> = (0..3)
            .map(|_| route.pick(None).unwrap().address.clone())
            .collect();
        seen.sort();
        assert_eq!(seen, ["a:1", "b:1", "c:1"], "one request each, in turn");
        // Two held on a and b: c is the least loaded.
        let held_a = route.pick(None).unwrap();
        let held_b = route.pick(None).unwrap();
        assert_ne!(held_a.address, held_b.address);
        let third = route.pick(None).unwrap();
        assert!(third.address != held_a.address && third.address != held_b.address);
        drop((held_a, held_b, third));
        assert!(route.targets.iter().all(|target| target.outstanding() == 0));
    }

    #[test]
    fn a_failed_copy_is_avoided_unless_it_is_alone() {
        let table = RouteTable::build(
            &[view("web.shop", "", &[("a:1", 1), ("b:1", 2)])],
            "example.test",
            None,
        );
        let route = table.by_name("web.shop").unwrap();
        for _ in 0..4 {
            let first = route.pick(None).unwrap();
            let second = route.pick(Some(&first)).unwrap();
            assert_ne!(first.address, second.address);
        }
        let alone = RouteTable::build(&[view("one", "", &[("a:1", 1)])], "", None);
        let route = alone.by_name("one").unwrap();
        let first = route.pick(None).unwrap();
        assert_eq!(route.pick(Some(&first)).unwrap().address, "a:1");
    }

    #[test]
    fn picks_from_many_threads_while_counts_change_never_fail() {
        let table = RouteTable::build(
            &[view("web.shop", "", &[("a:1", 1), ("b:1", 2), ("c:1", 3)])],
            "example.test",
            None,
        );
        let route = table.by_name("web.shop").unwrap().clone();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let route = route.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let first = route.pick(None).expect("a copy");
                        let second = route.pick(Some(&first)).expect("another copy");
                        assert_ne!(first.address, second.address);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(route.targets.iter().all(|target| target.outstanding() == 0));
    }

    #[test]
    fn a_rebuilt_table_keeps_the_counters_of_the_copies_that_stay() {
        let first = RouteTable::build(
            &[view("web.shop", "", &[("a:1", 1), ("b:1", 2)])],
            "example.test",
            None,
        );
        let held = first.by_name("web.shop").unwrap().pick(None).unwrap();
        let second = RouteTable::build(
            &[view("web.shop", "", &[("a:1", 1), ("b:1", 2), ("c:1", 3)])],
            "example.test",
            Some(&first),
        );
        let route = second.by_name("web.shop").unwrap();
        let kept = route
            .targets
            .iter()
            .find(|target| target.address == held.address)
            .unwrap();
        assert_eq!(kept.outstanding(), 1);
        drop(held);
        assert_eq!(kept.outstanding(), 0);
    }

    #[test]
    fn a_host_taken_by_an_earlier_route_is_a_conflict() {
        let table = RouteTable::build(
            &[
                view("b", "api.example.test", &[("b:1", 2)]),
                view("a", "api.example.test", &[("a:1", 1)]),
            ],
            "example.test",
            None,
        );
        assert_eq!(table.len(), 1);
        assert_eq!(table.by_host("api.example.test").unwrap().name, "a");
        assert_eq!(table.conflicts.len(), 1);
    }
}
