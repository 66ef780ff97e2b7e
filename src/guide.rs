//! The user's guide: chapters that are documentation only (this module has no
//! code).
//!
//! - [`lifecycle`]: the lifecycle of an endpoint, its kinds, and which rule
//!   is checked at compile time and which at run time.
//! - [`reading_the_compiler`]: every misuse the types refuse, the message
//!   rustc prints for it, the fix and the rule of the driver contract behind
//!   it; how to read the plain borrow and move errors in this API's terms.
//! - [`copies`]: moving data: copy batches, routes and graphs, what each
//!   op is checked for before the driver (the errors, their rules and
//!   fixes), and the two paths a copy takes.
//! - [`threads`]: which types may cross threads, and how to bind from several
//!   threads at once.
//! - [`sharing`]: endpoints shared across processes and nodes: the team
//!   bring-ups, what the ranks agree on, the failures every rank sees, the
//!   model fabric, the classic fallback.
//! - [`backends`]: the reference model and the real driver, how the backend
//!   is chosen on a real machine, and the wrappers and switches for it.
//! - [`security`]: what the TCP bootstrap, `FdExchange` and a fabric
//!   handle's bytes are trusted for, what a peer's memory shares can make
//!   this rank's copies do on the portable path, what the model fabric is
//!   (a test tool on one machine) and what it promises anyway.
//! - [`guarantees`]: what the crate promises (no leak, no hang, no undefined
//!   behaviour from safe code, every driver error surfaced) and the test
//!   that proves each promise.
//! - [`contract`]: the driver contract, restated rule by rule (R1–R13,
//!   F1–F9, C1–C6). Rule numbers in errors, messages and docs (`R5.6`) are its.

#[doc = include_str!("guide/lifecycle.md")]
pub mod lifecycle {}

pub mod reading_the_compiler {
    //! # Reading the compiler
    //!
    //! The lifecycle of a logical endpoint is in its type,
    //! [`Endpoint<S, K>`](crate::Endpoint): state `S` is `Reserved`, `Pending`
    //! or `Ready`, kind `K` says what sits on the id. A call that the driver
    //! contract forbids in the state or kind at hand does not compile. Every
    //! such error below is pinned by a test case in `ui-tests/` (named in the
    //! last column) with rustc 1.95's exact output beside it, and the correct
    //! version of each group is in `ui-tests/pass/`. On any other compiler,
    //! `cargo test -p cuda-endpoints-ui` still proves every case refused with the same
    //! error code, without comparing the words (through the doctests of
    //! `guide::misuse_cases`, a module built only by `cargo test --doc`, so
    //! not in these pages: its cases are in `src/guide.rs`).
    //!
    //! ## How the messages are laid out
    //!
    //! Where this crate can word the message (an unmet trait bound, `E0277`),
    //! it reads:
    //!
    //! ```text
    //! error[E0277]: cannot release the id of a `cuda_endpoints::Ready` endpoint: the endpoint on it still exists
    //!   --> src/main.rs:12:8
    //!    |
    //! 12 |     ep.release()?;
    //!    |        ^^^^^^^ this endpoint is `cuda_endpoints::Ready`, not `Reserved`
    //!    |
    //!    = help: the trait `CanRelease` is not implemented for `cuda_endpoints::Ready`
    //!    = note: ids are released only once empty (R1.2, R7.1): call `.destroy()` first; it hands back the `Endpoint<Reserved>` to release
    //! ```
    //!
    //! - the headline (`error[E0277]: ...`) says what is wrong;
    //! - the label under the call names the state or kind the compiler saw;
    //! - the `note:` names the call to make instead, and the rule.
    //!
    //! Skip the `help: the trait ... is not implemented for ...` line: it
    //! names the internal trait behind the check; and the block `help: the
    //! following other types implement trait ...` after it, when it comes:
    //! a list of the states or kinds that pass the check (`Ready`,
    //! `TeamReady`...), which the `note:` already names. Where it says `B0`, that is
    //! typenum's "false" (a team count that did not add up). Messages about
    //! export name how the endpoint came to be (`Local`: created without
    //! `.exportable()`; `ImportedUnicast`, `ImportedMulticast`: imported), not
    //! its whole kind, so that a compile-time team's typenum count never
    //! shows. `Pending` and
    //! `Ready` print as `cuda_endpoints::Pending` and `cuda_endpoints::Ready`
    //! because the standard library has types of the same names.
    //!
    //! Borrow, move, unsafe and "no method" errors (`E0505`, `E0597`, `E0382`,
    //! `E0133`) cannot be worded by a library; [how to read
    //! them](#borrow-and-move-errors-in-this-apis-terms) is below the tables.
    //!
    //! ## States: reserve, create, wait, bind, destroy, release
    //!
    //! | you wrote | the compiler says | the fix | rule | case |
    //! | --- | --- | --- | --- | --- |
    //! | `id.bind(dev, 0, &mem)` on a `Reserved` id | the endpoint is not ready: binding memory, copies and `kernel_ref` need a `Ready` endpoint, but this endpoint is `Reserved` | `id.create(spec)?.wait(timeout)?`, then bind on what `wait` returns | R3.1, R5.1 | `state_bind_on_reserved` |
    //! | `ep.bind(..)` right after `create` | ... but this endpoint is `cuda_endpoints::Pending` | `let ep = ep.wait(timeout)?;` (or loop on `.poll()`), then bind | R3.1, R5.1 | `state_bind_on_pending` |
    //! | `ep.kernel_ref()` right after `create` | ... but this endpoint is `cuda_endpoints::Pending` | wait first: a kernel must never see an endpoint under construction | R3.4 | `state_kernel_ref_on_pending` |
    //! | `id.export()` on a reserved id | `export` needs a created endpoint, but this id is `Reserved` | create from an `.exportable()` spec first; a pending endpoint may be exported (spread teams are exported before they are complete) | R8 | `state_export_on_reserved` |
    //! | `ep.create(spec)` on an id that already holds an endpoint | this id already holds an endpoint: `create`/`import` need a `Reserved` id, but this endpoint is `cuda_endpoints::Pending` | `ep.destroy()?` hands back the `Endpoint<Reserved>` to create on; or reserve another id | R2.1 | `state_create_on_pending` |
    //! | `ep.release()` on a `Pending` endpoint | cannot release the id of a `cuda_endpoints::Pending` endpoint: the endpoint on it still exists | `ep.destroy()?.release()?` | R1.2, R7.1 | `state_release_pending` |
    //! | `ep.release()` on a `Ready` endpoint | cannot release the id of a `cuda_endpoints::Ready` endpoint: the endpoint on it still exists | `ep.destroy()?.release()?` | R1.2, R7.1 | `state_release_ready` |
    //! | `id.destroy()` on a `Reserved` id | `destroy` needs a created endpoint, but this id is `Reserved` | nothing to destroy: `id.release()?`, or create on it | R1, R7 | `state_destroy_on_reserved` |
    //! | `id.poll()` on a `Reserved` id | `poll`/`wait` needs a `Pending` endpoint, but this endpoint is `Reserved` | `id.create(spec)?` (or `.import(&handle)?`) and poll what it returns | R3 | `state_poll_on_reserved` |
    //! | `id.wait(timeout)` on a `Reserved` id | `poll`/`wait` needs a `Pending` endpoint, but this endpoint is `Reserved` | as above | R3 | `state_wait_on_reserved` |
    //! | `ep.wait(timeout)` a second time | `poll`/`wait` needs a `Pending` endpoint, but this endpoint is `cuda_endpoints::Ready` | nothing to wait for: use the ready endpoint as it is | R3 | `state_wait_on_ready` |
    //! | `id.add_device(dev)` on a `Reserved` id | `add_device` needs a `Pending` team, but this endpoint is `Reserved` | `id.create(Spec::team(U4::new(), bytes))?.add_device(dev)?` | R4 | `state_add_device_on_reserved` |
    //! | `team.add_device(dev)` after `wait` | `add_device` needs a `Pending` team, but this endpoint is `cuda_endpoints::Ready` | enroll every device before `wait`; enrollment is permanent, so a different team means `destroy` and a new `create` | R4.3, R4.4 | `state_add_device_after_ready` |
    //! | `ep.unbind(dev, offset, size)` | an endpoint has no `unbind(dev, offset, size)`: unbind through the `Binding` that `bind` returned | unbind through the token: `binding.unbind()?`, or drop the [`Binding`](crate::Binding) | R6, C4 | `state_unbind_on_endpoint` |
    //!
    //! There is no unbind by offset and size on purpose: an unbind that does
    //! not match its bind is an error for logical endpoints (R6.1, R6.2) and
    //! undefined behaviour for classic multicast (C4). The token remembers the
    //! exact device, offset and size.
    //!
    //! ## Teams: size and enrollment
    //!
    //! | you wrote | the compiler says | the fix | rule | case |
    //! | --- | --- | --- | --- | --- |
    //! | `Spec::team(U4::new(), ..)`, three `add_device`, then `.wait(..)` | this multicast team is not complete: `wait`, `poll` and `wait_all` need every team device enrolled | add the missing device(s) before waiting | R3.2, R4.4 | `team_wait_incomplete` |
    //! | `.poll()` on a team with devices missing | the same | the same | R3.2, R4.4 | `team_poll_incomplete` |
    //! | [`wait_all`](crate::wait_all) over teams with devices missing | the same, at the `wait_all` argument | the same, for every team in the list | R3.2, R3.5 | `team_wait_all_incomplete` |
    //! | a third `add_device` on `Spec::team(U2::new(), ..)` | this multicast team is already complete: it has no room for another device | drop the call, or create a larger team | R4.2 | `team_one_device_too_many` |
    //! | `bind` on `Spec::team(U2::new(), ..)` with one device enrolled | the endpoint is not ready: binding memory, copies and `kernel_ref` need a `Ready` endpoint, but this endpoint is `cuda_endpoints::Pending` (the note: a `Spec::team(..)` team needs every device of the team enrolled before it can be waited for) | `add_device` every device of the team, `wait`, then bind on what `wait` returns | R3.1, R3.2, R4.4 | `team_bind_incomplete` |
    //! | `bind_part` on a team with devices missing | the same | the same | R3.1, R3.2, R4.4 | `team_bind_part_incomplete` |
    //! | `kernel_ref()` on a team with devices missing | the same | the same: a kernel must never see a team under construction | R3.2, R3.4 | `team_kernel_ref_incomplete` |
    //! | `export()` on a `Spec::team(..)` team created without `.exportable()` | `export` needs an endpoint created with fabric handles (`.exportable()`), but this endpoint is `Local` | create from `Spec::team(size, bytes).exportable()`; a pending team may be exported, so the other ranks can import it | R8.1 | `team_export_incomplete_not_exportable` |
    //! | `Spec::team(4, ..)` with a plain number | the team size must be a typenum number such as `U4::new()`, not `{integer}` | `Spec::team(U4::new(), bytes)` (`use cuda_endpoints::typenum::U4;`), or `Spec::multicast(&devices, bytes)` for a size known only at run time. `Spec::team(U4, ..)`, the type without `::new()`, is rustc's own `E0423` expected value, found type alias: write `U4::new()` | R2.2 | `team_size_plain_number` |
    //! | `Spec::team(U0::new(), ..)` | a multicast team needs at least one device, but this team size is zero | a non-zero size, e.g. `U4::new()` | R2.2 | `team_size_zero` |
    //! | `add_device` on a unicast endpoint | `add_device` is only for teams enrolled device by device (`Spec::team`, `Spec::spread`); a `cuda_endpoints::Unicast` endpoint takes no devices after `create` | a unicast endpoint's one device is its owner, given to `Spec::unicast(owner, ..)`; for a team, create a multicast endpoint | R4.1 | `team_add_device_on_unicast` |
    //! | `add_device` on a `Spec::multicast(&devices, ..)` endpoint | the same, for `cuda_endpoints::Multicast` | `create` already enrolled the devices listed: list every device there, or use [`Spec::team`](crate::Spec::team) to add them one by one | R4.2 | `team_add_device_on_runtime_multicast` |
    //!
    //! A compile-time team counts only the devices *this process* enrolls; a
    //! team spread over processes is `Spec::spread(n, bytes)`, which the
    //! compiler cannot count and a query reports complete.
    //!
    //! ## Memory and sharing
    //!
    //! | you wrote | the compiler says | the fix | rule | case |
    //! | --- | --- | --- | --- | --- |
    //! | `bind` on an imported unicast endpoint | an imported unicast endpoint accepts no memory: binding on it is not allowed | bind in the exporting process; here, pass `kernel_ref()` to kernels | R5.7 | `memory_bind_on_imported_unicast` |
    //! | `bind` on an imported team by hand, before the wait (and so before every rank enrolled) | the endpoint is not ready: binding memory, copies and `kernel_ref` need a `Ready` endpoint, but this endpoint is `Pending` | use `team::multicast`, whose agreement steps order enrollment, wait and bind across ranks; by hand, `.wait(timeout)` first | R3.1, R3.2, R4.4 | `team_bind_before_agreement` |
    //! | a copy (`put`, `get`, `put_host`, `get_host`) through `team.endpoint()` or `peers.peer(r)` before the ranks agreed that every rank bound | no copy through a team's endpoint before its ranks agreed that every rank bound its memory (R13.3): this endpoint is `TeamReady` | bind, then `team.agree_bound(&boot, timeout)?` on every rank, and copy through the endpoints of what it returns | R13.3 | `team_copy_before_agree_bound` |
    //! | `stream.route(&src, team.endpoint())` before the ranks agreed that every rank bound | the same message, once, at the route (its `put` adds none) | as above: route into `bound.endpoint()` or `bound.peer(rank)` | R13.3 | `team_route_before_agree_bound` |
    //! | a copy through `team.into_endpoint()`, the team's endpoint owned before any agreement | the same message: the owned endpoint is still `TeamReady` | `team.into_bound([(dev, offset, mem)], &boot, timeout)?` on every rank: it binds, agrees, and hands back an `OwnedTeam` that copies | R13.3 | `team_copy_through_owned_endpoint_before_agreement` |
    //! | `Allocation::<Private>` bound on the endpoint of a `team::multicast` bring-up | `Private` memory cannot be bound here: this `SharedMulticast` endpoint takes only externally shareable memory | allocate with `Allocation::<FabricShareable>` (then `agree_bound`) or, on one node, `Allocation::<PosixFd>` (then `agree_bound_fds`) | R5.6 | `team_shared_private_memory` |
    //! | `unbind_all()` on an owned team (`team.into_bound(..)`), one member alone | an owned team has no `unbind_all`: one member's unbind alone lets the others put into a member with nothing bound (R13.7) | `team.close(&boot, timeout)?` on every rank: each completes its copies, all agree, then each unbinds, destroys and frees | R13.7 | `team_unbind_all_of_one_member_alone` |
    //! | the owning form used after `unbind_all` | `E0382` borrow of moved value: `window` ... `unbind_all` takes ownership of the receiver | keep what `unbind_all` handed back (the endpoint and the memory) and bind on the endpoint, or build a new owning form with `into_bound()` | R6, R7 | `team_owned_after_unbind_all` |
    //! | `Allocation::<Private>` bound on an endpoint made with `.exportable()` | `Private` memory cannot be bound here: this `cuda_endpoints::Multicast<Exportable>` endpoint takes only externally shareable memory | allocate with `Allocation::<PosixFd>` or `Allocation::<FabricShareable>` | R5.6 | `memory_private_on_exportable` |
    //! | `Allocation::<Private>` bound on an imported multicast endpoint | the same, for `ImportedMulticast` | the same | R5.6 | `memory_private_on_imported_multicast` |
    //! | `export()` on an endpoint created without `.exportable()` | `export` needs an endpoint created with fabric handles (`.exportable()`), but this endpoint is `Local` | create from `spec.exportable()` | R8.1 | `share_export_not_exportable` |
    //! | `export()` on an imported endpoint | the same, for `ImportedUnicast` | pass on the handle it was imported from | R8.1 | `share_export_imported` |
    //! | `FabricHandle::<SpreadTeam>::from_bytes(..)` (or `import` of it) | `FabricHandle` needs a kind created with fabric handles (`Exportable`), but `SpreadTeam` is not one | name the exporter's kind: `FabricHandle::<SpreadTeam<Exportable>>` | R8.1 | `share_from_bytes_without_exportable` |
    //! | a driver method called on a backend (`model.destroy(id)`) outside `unsafe` | `E0133` call to unsafe function `cuda_endpoints::driver::Driver::destroy` is unsafe and requires unsafe block | go through the typed API (`ep.destroy()`); a raw call is `unsafe` and its `# Safety` names the rules the caller takes on | R3.4, C3, C4, R7.2 | `unsafe_raw_driver_call` |
    //! | `ep.bind_raw_addr(..)` outside `unsafe` | `E0133` call to unsafe function ... `bind_raw_addr` is unsafe and requires unsafe block | prefer `Allocation::map` and `bind`, which keep the memory alive; else `unsafe { .. }` with a `// SAFETY:` line saying why the address stays mapped while bound | R5, R7.2 | `unsafe_bind_raw_addr` |
    //! | `ep.bind(dev, 0, &mem)?;` as a statement | `unused Binding that must be used` (an error under `#![deny(unused_must_use)]`, else a warning) | `let b = ep.bind(..)?;`, kept for as long as the memory should stay bound. Not `let _ = ..`, which rustc suggests: it unbinds at once | R6 | `lint_binding_discarded` |
    //!
    //! ## Moves: a value a call consumed
    //!
    //! Every transition takes the endpoint by value and returns it in its new
    //! state, so the old name is gone. The fix is always to use what the call
    //! returned.
    //!
    //! | you wrote | the compiler says | the fix | rule | case |
    //! | --- | --- | --- | --- | --- |
    //! | `id.create(a)` then `id.create(b)` | `E0382` use of moved value: `id` | one id holds one endpoint: reserve two ids (`ctx.reserve(2)?.into_endpoints()`), or `destroy` the first and create on the id it returns | R2.1 | `move_create_twice` |
    //! | `ep.destroy()?` then `ep.bind(..)` | `E0382` borrow of moved value: `ep` | bind before destroying; `destroy` returns only the `Reserved` id | R7 | `move_use_after_destroy` |
    //! | `range.into_endpoints()` then `range.release()` | `E0382` use of moved value: `range` | the endpoints now own the ids: release each (or drop them); the range goes back with the last one | R1 | `move_range_release_after_split` |
    //! | `b.unbind()?` twice | `E0382` use of moved value: `b` | unbind once: the token is consumed, so a second unbind cannot exist | R6.1, C4 | `move_unbind_twice` |
    //!
    //! ## Borrows: bindings and kernel references
    //!
    //! A [`Binding`](crate::Binding) borrows its endpoint and its memory; an
    //! [`EndpointRef`](crate::EndpointRef) borrows its endpoint. While one of
    //! them is alive, the endpoint cannot be destroyed or dropped and the
    //! memory cannot be freed or unmapped.
    //!
    //! | you wrote | the compiler says | the fix | rule | case |
    //! | --- | --- | --- | --- | --- |
    //! | `ep.destroy()` with a binding alive | `E0505` cannot move out of `ep` because it is borrowed | `b.unbind()?` (or `drop(b)`) for every binding first, then destroy | R6, R7 | `borrow_destroy_while_bound` |
    //! | a binding kept after its endpoint's scope ended | `E0597` `ep` does not live long enough | keep the endpoint in the outer scope, or unbind inside the inner one | R7 | `borrow_binding_outlives_endpoint` |
    //! | `drop(mem)` while `mem` is bound | `E0505` cannot move out of `mem` because it is borrowed | unbind first, then free | R7.2 | `borrow_drop_allocation_while_bound` |
    //! | `drop(mapped)` while it is bound by address | `E0505` cannot move out of `mapped` because it is borrowed | unbind first, then unmap | R7.2 | `borrow_drop_mapped_while_bound` |
    //! | `ep.kernel_ref()`, `destroy`, then the launch | `E0505` cannot move out of `ep` because it is borrowed | launch (and synchronise) before destroying | R3.4, R7 | `thread_endpoint_ref_outlives_endpoint` |
    //! | an `EndpointRef` moved into `std::thread::spawn` | `E0597` `ep` does not live long enough ... argument requires that `ep` is borrowed for `'static` | use `std::thread::scope`: see [`threads`](super::threads) | R7 | `thread_endpoint_ref_to_spawn` |
    //! | a `Binding` moved into `std::thread::spawn` | `E0597` `ep` (and `mem`) does not live long enough ... borrowed for `'static` | bind inside a scoped thread, or keep the binding on the spawning thread | R7.2 | `thread_binding_to_spawn` |
    //!
    //! ## Copies: the data path
    //!
    //! **What compiles, and waits at run time**: an unbind under a copy that
    //! names `&ep`. A copy's [`InFlight`](crate::InFlight) token borrows the
    //! endpoint but not its [`Binding`](crate::Binding), so `b.unbind()`
    //! compiles while the copy is in flight; the unbind then synchronizes
    //! the streams with copies in flight on the endpoint first (and waits
    //! for a copy another thread is enqueueing through it), so nothing is
    //! unbound under a copy, but the wait is a stall you did not write. To
    //! make it a compile error instead, lend the endpoint through the
    //! binding ([`Binding::copy_through`](crate::Binding::copy_through)), or
    //! keep it in a [`BoundEndpoint`](crate::BoundEndpoint):
    //!
    //! ```ignore
    //! let b = ep.bind(dev, 0, &mem)?;
    //! let copy = stream.enqueue(CopyBatch::new().put_host(bytes, &ep, 0))?;
    //! b.unbind()?;                                        // compiles: waits for `copy` first
    //! let b = ep.bind(dev, 0, &mem)?;
    //! let copy = stream.enqueue(CopyBatch::new().put_host(bytes, b.copy_through(&ep)?, 0))?;
    //! b.unbind()?;                                        // E0505: `b` is borrowed by `copy`
    //! ```
    //!
    //! Why not always: the binding and the copy both borrow `&ep`, and two
    //! shared borrows may live together; `unbind` consumes the binding,
    //! which conflicts only with a borrow of the binding itself. Refusing
    //! `&ep` in copies would make every copy through a local endpoint name
    //! its binding, and a multicast put every binding of every local member.
    //!
    //! A copy's memory argument is `&mapped`, or a reference to an `Arc`,
    //! a `Box` or an `Rc` of one ([`CopyMemory`](crate::bounds::CopyMemory));
    //! anything else is refused with a note per usual mistake (rows below).
    //! Otherwise the token borrows every endpoint and all memory its batch
    //! names, and owns its host buffers, until it is waited (F4); a
    //! [`CopyGraph`](crate::CopyGraph) borrows them for as long as it lives
    //! (F8). A graph may run for as long as it lives, so while a graph names
    //! `&ep` an unbind on it is refused at run time
    //! ([`Error::UnbindUnderGraph`](crate::Error::UnbindUnderGraph), F8,
    //! before the driver; the memory stays bound). A batch built before a
    //! bind or unbind is checked against the bindings at the enqueue.
    //!
    //! | you wrote | the compiler says | the fix | rule | case |
    //! | --- | --- | --- | --- | --- |
    //! | `put(.., &ep, ..)` (or any copy, a `route`) through an endpoint not yet waited for (`Pending`) | the endpoint is not ready: binding memory, copies and `kernel_ref` need a `Ready` endpoint, but this endpoint is `cuda_endpoints::Pending` | `.wait(timeout)?` first and copy through the `Endpoint<Ready, _>` it returns (a bring-up's endpoint: after `agree_bound`, above) | R3.1, F9 | `copy_put_on_pending` |
    //! | `put(&alloc, ..)` (or `get`, a strided op, `route`) with an [`Allocation`](crate::Allocation) not mapped | a copy's memory argument is a `&Mapped` (memory mapped in this process), and `&Allocation` is not one (F1) | `let mapped = alloc.map(&[dev])?;`, then pass `&mapped`: a copy works on addresses, which an allocation has only once mapped (`bind` takes both) | F1 | `copy_put_from_unmapped_allocation` |
    //! | `put(&bytes, ..)` with host bytes (a `Vec<u8>`, a slice) | the same, `&Vec<u8>` is not one (F1) | `put_host(bytes, &ep, offset)`, and `get_host(&ep, offset, size)` to read into a new host buffer: the batch owns the buffer until the copy is waited | F1 | `copy_put_from_host_bytes` |
    //! | `get(&dst, 0, &ep, 0, n)`: a get in `put`'s order | the same, `&Endpoint<..>` is not one (F1), and `E0308` expected `&Endpoint<_, _>`, found `&Mapped` | the endpoint first in a get, as the copy reads: `get(&ep, offset, &dst, dst_offset, size)`; the memory first in a put | F1 | `copy_get_arguments_swapped` |
    //! | `get` or `get_host` from a multicast endpoint | a get reads from a unicast endpoint only: `Multicast` is a multicast endpoint, which has no single memory to read from (F1) | read your own member's bound memory directly, or get from the unicast endpoint of the rank that owns the bytes (`team::unicast_peers`) | F1 | `copy_get_from_multicast` |
    //! | `b.unbind()` while a copy lent the endpoint through `b.copy_through(&ep)?` is in flight | `E0505` cannot move out of `b` because it is borrowed | `copy.wait()?` (or synchronize the stream and drop the token), then `b.unbind()?` | F4 | `copy_unbind_while_in_flight` |
    //! | `ep.destroy()` while a copy through `ep` is in flight | `E0505` cannot move out of `ep` because it is borrowed | wait the copy first, then unbind and destroy | F4 | `copy_destroy_while_in_flight` |
    //! | a host buffer used (or dropped) after `put_host` took it | `E0382` use of moved value | the batch owns the buffer until the copy is waited: `copy.wait()?` hands it back | F4 | `copy_drop_host_buffer_while_in_flight` |
    //! | `drop(src)` while a copy from `src` is in flight | `E0505` cannot move out of `src` because it is borrowed | wait the copy first, then unmap | F4 | `copy_drop_mapped_while_in_flight` |
    //! | `drop(src)` while a put that `stream.route(&src, &ep)` made is in flight | `E0505` cannot move out of `src` because it is borrowed | wait the copy first, then unmap: its token borrows what the route borrows, past the route | F4 | `copy_route_drop_mapped_while_in_flight` |
    //! | unbinding a `BoundEndpoint` while a `CopyGraph` through it lives | `E0505` cannot move out of `bound` because it is borrowed | drop the graph first (after its last launch was waited), then unbind | F8 | `copy_graph_unbind_while_graph_lives` |
    //! | `heap.shrink(..)` while a copy through `heap.peer(r)` is in flight | `E0502` cannot borrow `heap` as mutable because it is also borrowed as immutable | wait every copy through the heap first: every rank stops using the top chunk before any rank unbinds it | R13.7 | `team_shrink_while_copy_in_flight` |
    //! | a copy through `bound.own()` or `bound.peer(r)` after `bound.close(..)` (`BoundPeers`; `BoundTeam::endpoint` alike) | `E0505` cannot move out of `bound` because it is borrowed | make every copy before the close, the agreement that every rank stopped copying; to copy again, agree again (`agree_bound`) | R13.7 | `team_copy_through_bound_peers_after_close` |
    //! | `heap.grow(..)` while a route into `heap.own()` or `heap.peer(r)` lives | `E0502` cannot borrow `heap` as mutable because it is also borrowed as immutable | drop the route, grow, make a new route: a route read the endpoint's facts, the agreed top among them | R13.3 | `team_grow_while_route_lives` |
    //! | a peer's endpoint kept after its `OwnedPeers` is dropped | `E0505` cannot move out of `owned` because it is borrowed | use the peers only while the communicator lives; dropping it destroys every imported peer | R7, R13.7 | `team_peer_outlives_owned_peers` |
    //!
    //! A copy through an [`OwnedPeers`](crate::team::OwnedPeers) heap past its
    //! agreed top compiles but is refused before the driver
    //! ([`Error::CopyNotAgreed`](crate::Error::CopyNotAgreed), R13.3): the top is known at run time only.
    //!
    //! Many blocks at a stride (a gather's rows, an all-to-all's slices) are
    //! one call, [`CopyBatch::put_strided`](crate::CopyBatch::put_strided)
    //! or [`get_strided`](crate::CopyBatch::get_strided) with a
    //! [`Strided`](crate::Strided): the same ops as its puts or gets one by
    //! one, refused alike (test
    //! `a_strided_call_is_the_batch_of_its_ops_one_by_one_the_same_bytes_or_refused_alike`),
    //! checked once against its last block, so each further op costs what
    //! the raw op list costs (`benches/README.md`, "Copy batch per op").
    //!
    //! The same put made again and again (a halo to one neighbour, a
    //! small message to one peer each step) goes through a
    //! [`Route`](crate::Route): `let mut r = stream.route(&src, &ep);` once,
    //! then `r.put(src_offset, offset, size)?` per message. Each put is
    //! the batch of that put alone, checked the same and answering the
    //! same (test `data_path::issue_30_a_routes_put_is_checked_as_the_batch_of_that_put`),
    //! but the route read the endpoint's facts when it was made, and reads
    //! them again only after a bind or unbind: on `Null` its put is under
    //! half the instructions of the batch's (`benches/README.md`, "One put
    //! through a route"). The route borrows the memory, the endpoint and
    //! the stream, and its tokens borrow them past it; a heap cannot grow
    //! or shrink while a route into it lives (`team_grow_while_route_lives`).
    //!
    //! ## Borrow and move errors in this API's terms
    //!
    //! rustc words these in terms of variables; here is what they mean for
    //! endpoints.
    //!
    //! - **`E0505` cannot move out of `ep` because it is borrowed**, pointing
    //!   at `.destroy()` (or `drop(ep)`): something still borrows the
    //!   endpoint, a `Binding` (`borrow of ep occurs here` points at the
    //!   `bind`) or an `EndpointRef` (at `kernel_ref`). Unbind or drop the
    //!   binding, finish with the reference, then destroy. If the last label
    //!   reads "borrow might be used here, when `b` is dropped and runs the
    //!   `Drop` code for type `Binding`", the binding is still in scope and
    //!   would unbind after the destroy: `drop(b)` or `b.unbind()?` before it.
    //! - **`E0505` cannot move out of `mem` because it is borrowed**, at
    //!   `drop(mem)`: that memory is still bound. Unbind it first (R7.2).
    //! - **`E0597` `ep` does not live long enough**: a binding or kernel
    //!   reference lives longer than its endpoint, either because it is used
    //!   after the endpoint's scope ends or because it went to a
    //!   `thread::spawn` closure, which must be `'static` ("argument requires
    //!   that `ep` is borrowed for `'static`"). Shorten the binding, lengthen
    //!   the endpoint, or use scoped threads.
    //! - **`E0382` use of moved value**: a consuming call (`create`, `wait`,
    //!   `add_device`, `destroy`, `release`, `unbind`, `into_endpoints`)
    //!   already took the value. Use what that call returned: each transition
    //!   hands back the endpoint in its next state (on failure, inside
    //!   [`Failed`](crate::Failed), unchanged).
    //! - **`E0133` call to unsafe function**: only `bind_raw_addr`, which cannot
    //!   check that a raw address stays mapped. Bind an
    //!   [`Allocation`](crate::Allocation) or [`Mapped`](crate::Mapped)
    //!   instead, or write the `unsafe` block and its safety argument.
    //!
    //! ## Pitfalls with rustc's own wording
    //!
    //! - `Allocation::on_device(..)` without a handle type gives `E0283` type
    //!   annotations needed for `Allocation<_>`: write
    //!   `Allocation::<Private>::on_device(..)` (or `PosixFd`, `FabricShareable` for
    //!   memory that exportable or imported multicast endpoints bind).
}

pub mod threads {
    //! # Threads
    //!
    //! | type | `Send` | `Sync` | notes |
    //! | --- | --- | --- | --- |
    //! | [`Endpoint<S, K>`](crate::Endpoint), every state and kind | yes | yes | not `Clone`: one owner. A pending endpoint may be waited for on another thread; a ready one is bound from several threads through `&` |
    //! | [`Binding<'a>`](crate::Binding) | yes | yes | borrows the endpoint and the memory: it may go to a scoped thread, never to `thread::spawn` |
    //! | [`EndpointRef<'a>`](crate::EndpointRef) | yes | yes | `Copy`; borrows the endpoint, so likewise scoped threads only |
    //! | [`IdRange`](crate::IdRange), [`Context`](crate::Context) | yes | yes | a `Context` is a cheap handle: clone it per thread |
    //! | [`Allocation<H>`](crate::Allocation), [`Mapped<H>`](crate::Mapped) | yes | yes | |
    //! | [`FabricHandle<K>`](crate::FabricHandle) | yes | yes | plain bytes; send it to other processes as `to_bytes()` |
    //!
    //! Binding from one thread per device, on one ready endpoint: share the
    //! endpoint by reference into [`std::thread::scope`], bind inside each
    //! thread, and unbind (or let the bindings drop) before the scope ends.
    //! Concurrent binds on one endpoint see each other, so overlapping ranges
    //! on one device are still refused (R5.9).
    //!
    //! ```
    //! use std::time::Duration;
    //! use cuda_endpoints::{Allocation, Context, Private, Spec};
    //!
    //! let (ctx, model) = Context::model(Default::default());
    //! let devices = ctx.devices()?;
    //! let team = ctx
    //!     .reserve_one()?
    //!     .create(Spec::multicast(&devices, 2 << 20))?
    //!     .wait(Duration::from_secs(1))?;
    //! let mems = devices
    //!     .iter()
    //!     .map(|&d| Allocation::<Private>::on_device(&ctx, d, 2 << 20))
    //!     .collect::<Result<Vec<_>, _>>()?;
    //! std::thread::scope(|s| {
    //!     let workers: Vec<_> = devices
    //!         .iter()
    //!         .zip(&mems)
    //!         .map(|(&dev, mem)| {
    //!             let team = &team;
    //!             s.spawn(move || team.bind(dev, 0, mem)?.unbind())
    //!         })
    //!         .collect();
    //!     workers
    //!         .into_iter()
    //!         .try_for_each(|w| w.join().expect("worker panicked"))
    //! })?;
    //! team.destroy()?.release()?;
    //! drop(mems);
    //! assert!(model.live().is_empty());
    //! # Ok::<(), Box<dyn std::error::Error>>(())
    //! ```
    //!
    //! With `std::thread::spawn` instead, the closure must be `'static`, and a
    //! `Binding` or `EndpointRef` is not: the compiler answers "`ep` does not
    //! live long enough ... argument requires that `ep` is borrowed for
    //! `'static`" (`ui-tests/thread_*`). To hand an endpoint itself to a
    //! spawned thread, move it there: it is `Send`, and its id, range and
    //! context go with it.
}

#[doc = include_str!("guide/copies.md")]
pub mod copies {}

#[doc = include_str!("guide/sharing.md")]
pub mod sharing {}

#[doc = include_str!("guide/backends.md")]
pub mod backends {}

#[doc = include_str!("guide/guarantees.md")]
pub mod guarantees {}

#[doc = include_str!("guide/security.md")]
pub mod security {}

#[doc = include_str!("contract.md")]
pub mod contract {}

/// Every case of `ui-tests/` again, as doctests: so that any compiler, not
/// only the pinned one whose exact words the `.stderr` files hold, proves
/// that each misuse is still refused with its error code, and that each
/// correct version still compiles and runs. `tests/ui.rs` checks that this
/// list matches the directory and the first `error[E…]` of each `.stderr`,
/// and, on a compiler other than the pinned one, runs these doctests
/// (`cargo test --doc -- guide::misuse_cases`).
#[cfg(doctest)]
#[allow(non_camel_case_types)]
pub mod misuse_cases {
    /// One `compile_fail` doctest per case, with the error code rustc must
    /// report (`lint`: a lint the case itself denies, which has no code).
    macro_rules! refused {
        ($($case:ident: $code:ident,)*) => {$(refused!(@code $case $code);)*};
        (@code $case:ident lint) => {refused!(@doc $case "compile_fail");};
        (@code $case:ident $code:ident) => {
            refused!(@doc $case concat!("compile_fail,", stringify!($code)));
        };
        (@doc $case:ident $info:expr) => {
            #[doc = concat!(
                "```", $info, "\n",
                include_str!(concat!("../ui-tests/", stringify!($case), ".rs")),
                "\n```"
            )]
            pub struct $case;
        };
    }

    /// One doctest per correct version: it must compile and run.
    macro_rules! accepted {
        ($($case:ident,)*) => {$(
            #[doc = concat!(
                "```\n",
                include_str!(concat!("../ui-tests/pass/", stringify!($case), ".rs")),
                "\n```"
            )]
            pub struct $case;
        )*};
    }

    refused! {
        borrow_binding_outlives_endpoint: E0597,
        borrow_destroy_while_bound: E0505,
        borrow_drop_allocation_while_bound: E0505,
        borrow_drop_mapped_while_bound: E0505,
        copy_destroy_while_in_flight: E0505,
        copy_drop_host_buffer_while_in_flight: E0382,
        copy_drop_mapped_while_in_flight: E0505,
        copy_get_from_multicast: E0277,
        copy_get_arguments_swapped: E0277,
        copy_graph_unbind_while_graph_lives: E0505,
        copy_put_from_host_bytes: E0277,
        copy_put_from_unmapped_allocation: E0277,
        copy_put_on_pending: E0277,
        copy_route_drop_mapped_while_in_flight: E0505,
        copy_unbind_while_in_flight: E0505,
        lint_binding_discarded: lint,
        memory_bind_on_imported_unicast: E0277,
        memory_private_on_exportable: E0277,
        memory_private_on_imported_multicast: E0277,
        move_create_twice: E0382,
        move_range_release_after_split: E0382,
        move_unbind_twice: E0382,
        move_use_after_destroy: E0382,
        share_export_imported: E0277,
        share_export_not_exportable: E0277,
        share_from_bytes_without_exportable: E0277,
        state_add_device_after_ready: E0277,
        state_add_device_on_reserved: E0277,
        state_bind_on_pending: E0277,
        state_bind_on_reserved: E0277,
        state_create_on_pending: E0277,
        state_destroy_on_reserved: E0277,
        state_export_on_reserved: E0277,
        state_kernel_ref_on_pending: E0277,
        state_poll_on_reserved: E0277,
        state_release_pending: E0277,
        state_release_ready: E0277,
        state_unbind_on_endpoint: E0277,
        state_wait_on_ready: E0277,
        state_wait_on_reserved: E0277,
        team_add_device_on_runtime_multicast: E0277,
        team_add_device_on_unicast: E0277,
        team_bind_before_agreement: E0277,
        team_bind_incomplete: E0277,
        team_bind_part_incomplete: E0277,
        team_copy_before_agree_bound: E0277,
        team_route_before_agree_bound: E0277,
        team_copy_through_bound_peers_after_close: E0505,
        team_copy_through_owned_endpoint_before_agreement: E0277,
        team_export_incomplete_not_exportable: E0277,
        team_grow_while_route_lives: E0502,
        team_kernel_ref_incomplete: E0277,
        team_owned_after_unbind_all: E0382,
        team_unbind_all_of_one_member_alone: E0277,
        team_one_device_too_many: E0277,
        team_peer_outlives_owned_peers: E0505,
        team_poll_incomplete: E0277,
        team_shared_private_memory: E0277,
        team_shrink_while_copy_in_flight: E0502,
        team_size_plain_number: E0277,
        team_size_zero: E0277,
        team_wait_all_incomplete: E0277,
        team_wait_incomplete: E0277,
        thread_binding_to_spawn: E0597,
        thread_endpoint_ref_outlives_endpoint: E0505,
        thread_endpoint_ref_to_spawn: E0597,
        unsafe_bind_raw_addr: E0133,
        unsafe_raw_driver_call: E0133,
    }

    /// The correct versions (`ui-tests/pass/`).
    pub mod pass {
        accepted! {
        borrow_teardown_order,
        copy_put_and_get,
        memory_and_sharing,
        state_lifecycle,
        team_enrollment,
        team_owned_heap,
        thread_scoped_binds,
        unsafe_bind_raw_addr,
        }
    }
}
