#!/usr/bin/env bash
# Miri over the library's unsafe code (issue 27), held in CI.
#
# `cargo +nightly miri test` on the reference model (feature `model`, no
# sockets, no OS processes, no FFI), under Stacked Borrows and under Tree
# Borrows (the `unsafe` for speed in `src/range.rs` is a shared record cell
# reached through a cached pointer, which the two models judge differently):
#
#   1. the library's unit tests (`--lib`), the lifecycle that reuses the
#      context's spare range among them
#      (`range::tests::r1_a_released_range_is_kept_as_the_spare_and_reused_by_the_next_reserve`);
#   2. a curated list of the data path's and the rules' integration tests
#      (`tests/data_path.rs`, `tests/rules.rs`, `tests/copy_edges.rs`):
#      typed and raw copies, host buffers both ways, streams, events,
#      graphs, the portable path, every transition of R1-R9.
#
# Left out, each for its reason: the libcuda backend's tests (FFI, `dlopen`;
# `ci/double.sh` runs them natively); tests that start OS processes or
# sockets; tests that forget resources on purpose (`mem::forget`: Miri's leak
# check reports them); and the long randomized or exhaustive sweeps, which
# take minutes each under Miri and exercise no unsafe that the tests below
# do not.
#
# Host buffers cross the driver boundary as integers (`Pointer::host`, as
# `cuda.h` passes them), their provenance exposed by the library
# (`expose_provenance`) and taken back by the model
# (`with_exposed_provenance`): `-Zmiri-permissive-provenance` says that this
# is meant (it only silences the warning; an access outside an exposed
# allocation is still reported).
#
# Zero reports: any undefined behaviour, data race or leak fails the step.
# Both models: 6 min 2 s of wall clock, 278 s of CPU, on the shared 2-core
# development machine (load average about 5; 2026-12-02, the Miri builds
# already made; from a clean clone add about 1 min for `miri setup` and the
# Miri build of the dependencies).
#
# Usage: ci/miri.sh          (from anywhere in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."

# The nightly of `.ci/run` (1.97), with Miri and the standard library's
# sources for its sysroot.
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup component add --toolchain nightly miri rust-src
fi
cargo +nightly miri --version
cargo +nightly miri setup

# The model backs every test below; no other feature.
MIRI_TEST=(cargo +nightly miri test -p cuda-endpoints --features model)

# The library's unit tests on the model: all but the libcuda backend's
# (FFI, `dlopen`, the ABI check's C declarations), the bootstrap's byte
# parsers (`team::tagged`, `team::wire`, `team::retry`, `team::limits`: no
# model, no unsafe, minutes under Miri, whose clock runs past their
# bootstrap deadlines), the portable path's count of holds against 256
# bindings (no unsafe, minutes under Miri), the stream index's 1,000-batch loop (its
# data-path twin `batches_completed_through_events_leave_nothing_for_an_
# unbind_to_synchronize` runs below) and the memo's 10,000 random first
# puts (plain arithmetic; its edge case runs as a test of its own). Filters
# are substrings of test names.
LIB_SKIP=(
    --skip driver::cuda::
    --skip team::tagged::
    --skip team::wire::
    --skip team::retry::
    --skip team::limits::
    --skip copy::portable::tests::f4_a_portable_batch_in_flight_holds_as_much_against_1_binding_as_against_256
    --skip stream::tests::batches_completed_through_events_leave_the_records_and_a_dropped_stream_leaves_nothing
    --skip copy::memo::tests::the_memos_first_hit_is_the_facts
)

DATA_PATH=(
    a_batch_another_thread_enqueues_during_a_capture_runs_on_the_stream_and_is_not_captured
    a_dropped_stream_is_never_synchronized_even_while_an_event_recorded_on_it_lives
    an_endpoint_of_another_context_with_the_same_id_in_one_batch_is_the_wrong_context
    an_event_recorded_on_a_stream_of_another_device_is_refused_invalid_handle
    batches_completed_through_events_leave_nothing_for_an_unbind_to_synchronize
    a_range_released_while_a_stream_that_copied_to_it_is_dropped_is_never_changed_under_it
    f1_get_from_a_multicast_endpoint_and_endpoint_to_endpoint_are_refused
    f2_a_pointer_on_another_device_than_the_streams_is_refused
    f2_f9_a_batch_of_one_put_is_checked_as_the_same_put_followed_by_another
    issue_30_a_routes_put_is_checked_as_the_batch_of_that_put
    issue_30_a_routes_multicast_put_reaches_every_member_as_the_batchs
    f2_host_memory_is_an_operand_only_on_streams_of_devices_it_is_mapped_for
    f2_typed_memory_on_another_device_than_the_stream_is_refused_before_the_driver
    f3_dependent_copies_in_one_batch_are_refused
    f3_ops_that_meet_in_an_endpoints_own_bound_memory_are_dependent
    f3_ops_that_meet_in_one_allocation_bound_by_handle_twice_are_dependent
    f3_typed_dependent_ops_are_refused_naming_both_and_the_bytes_they_meet_in
    f3_a_put_from_other_memory_over_the_last_fast_put_is_dependent
    f4_a_forgotten_token_frees_nothing_in_flight
    f4_an_event_recorded_after_a_copy_completes_it_and_only_it
    f4_typed_copy_completes_through_its_event
    f4_unbinding_while_a_copy_is_in_flight_is_caught_when_the_stream_reaches_it
    f5_a_zero_byte_op_one_past_the_end_of_its_memory_is_refused_before_the_driver
    f5_f6_the_typed_api_sends_flags_zero_on_its_own_stream
    f5_flags_must_be_zero_and_a_zero_size_op_is_still_validated
    f6_the_legacy_null_stream_is_refused
    f7_the_fabric_copy_is_not_supported_before_13_5
    f7_typed_copy_on_a_13_4_driver_is_unsupported_naming_the_driver_version_and_the_portable_path
    f8_a_graph_launched_after_its_endpoint_was_unbound_is_logged
    f8_a_graphs_received_bytes_never_change_while_lent
    f9_puts_one_after_another_past_their_bound_interval_are_refused_naming_the_first_outside
    f8_an_unbind_after_the_graph_was_dropped_goes_through
    f8_an_unbind_under_a_live_graph_is_refused_before_the_driver_and_the_memory_stays_bound
    f8_typed_graph_launched_twice_copies_each_time_and_leaves_no_violation
    f9_a_batch_built_before_an_unbind_or_after_it_is_checked_against_the_bindings_at_enqueue
    f9_a_get_host_far_past_the_endpoint_is_refused_at_enqueue_with_no_buffer_of_that_size
    f9_an_endpoint_range_only_partly_bound_is_refused
    f9_typed_ranges_outside_the_endpoint_or_the_bound_memory_are_refused
    get_reads_the_unicast_owners_bound_memory
    host_memory_is_read_and_written_in_stream_order
    live_counts_streams_events_graphs_and_graph_execs_so_a_leaked_one_shows
    memcpy_async_moves_device_and_host_bytes_in_stream_order
    objects_of_two_contexts_are_refused_before_the_driver_naming_which_two
    multicast_put_reaches_every_members_bound_memory
    r13_3_a_copy_the_stream_reaches_before_the_owner_bound_is_caught
    stream_order_a_read_before_synchronize_sees_the_old_bytes
    stream_query_reports_done_only_after_the_stream_reached_every_batch
    the_typed_event_refuses_a_stream_of_another_device_before_the_driver
    typed_multicast_put_from_host_reaches_every_member
    typed_put_and_get_through_a_unicast_endpoint_leave_no_violation
)

# Every rule test on the model (R1-R10): each transition, typed and raw.
RULES=(
    a_failed_transition_displays_its_cause_and_debug_names_the_value_that_came_back
    map_takes_the_device_numbers_that_on_device_and_bind_take
    old_driver_reports_unsupported_with_version
    r10_limits_depend_on_properties
    r1_3_zero_count_refused_before_driver
    r1_raw_release_rules
    r1_reserve_split_release
    r2_2_devices_checked_before_create
    r2_3_size_checked_before_create_with_nearest_valid_size
    r2_4_counted_ops_needs_attribute_155
    r2_raw_create_codes
    r3_1_raw_bind_before_ready_is_invalid_value
    r3_2_team_waits_for_every_device
    r3_5_one_query_per_range
    r3_construction_is_asynchronous_and_wait_polls_at_least_once
    r4_5_clique_error_is_typed
    r4_compile_time_team
    r4_enrollment_checked_before_driver
    r4_raw_codes_and_cliques
    r5_6_exportable_takes_shareable_memory
    r5_bind_addr_and_host_numa
    r5_checks_before_driver
    r5_raw_codes
    r6_raw_unbind_must_match_binds
    r6_unbind_through_token_only
    r7_destroy_keeps_id_and_forgotten_binding_keeps_memory
    r8_1_raw_export_of_non_fabric_endpoint
    r8_r9_export_import_between_processes
    r9_3_spread_team_over_two_processes
    r9_refusals
    suggestions_are_valid_values
)

COPY_EDGES=(
    a_failed_call_of_a_capture_or_launch_leaves_nothing_and_breaks_no_rule
    a_peer_window_on_an_owned_unicast_endpoint_is_not_reported_as_a_missing_window
    a_portable_batch_whose_second_memcpy_fails_leaves_nothing_and_breaks_no_rule
    a_portable_op_copying_bytes_onto_themselves_is_not_reported_as_two_dependent_ops
    after_a_shrink_whose_unbind_failed_the_next_shrink_hands_back_the_chunk_it_unbound
    copies_across_the_seam_of_two_bindings_move_every_byte_on_both_paths
    f2_host_memory_mapped_without_access_for_the_streams_device_is_refused_before_the_driver
    f2_memory_of_another_nodes_device_with_the_same_ordinal_is_not_local
    f3_a_put_and_a_get_that_meet_in_memory_bound_at_two_offsets_are_dependent
    f3_two_puts_that_write_one_allocation_through_two_endpoints_are_dependent
)

# The portable path's one put through the window its facts keep (round 28).
PORTABLE=(
    issue_30_the_usual_put_lands_where_the_windows_say_at_the_put
)

# The curated tests NAMES of the test binary TARGET, by exact name, each
# behind PREFIX (a module path, `""` where the file is its own binary); a
# name no test has any more (renamed, moved) fails the step, so the list
# never shrinks unseen.
curated() {
    local target=$1 prefix=$2
    shift 2
    local names=("${@/#/$prefix}")
    local found
    found=$("${MIRI_TEST[@]}" --test "$target" -- --list --exact "${names[@]}" 2>/dev/null | grep -c ': test$' || true)
    if [ "$found" != "$#" ]; then
        echo "ci/miri.sh: $(($# - found)) of the $# tests listed for --test $target are gone: update the list" >&2
        exit 1
    fi
    "${MIRI_TEST[@]}" --test "$target" -- --exact "${names[@]}"
}

for model in stacked tree; do
    # Isolation stays on (no host clock, files or environment): proptest's
    # settings are set inside the interpreter, its failure files off.
    flags="-Zmiri-permissive-provenance"
    flags="$flags -Zmiri-env-set=PROPTEST_CASES=16"
    flags="$flags -Zmiri-env-set=PROPTEST_DISABLE_FAILURE_PERSISTENCE=1"
    if [ "$model" = tree ]; then
        flags="$flags -Zmiri-tree-borrows"
    fi
    export MIRIFLAGS="$flags"
    echo "miri ($model borrows): the library's unit tests"
    "${MIRI_TEST[@]}" --lib -- "${LIB_SKIP[@]}"
    echo "miri ($model borrows): tests/copy/data_path.rs, ${#DATA_PATH[@]} tests"
    curated copy data_path:: "${DATA_PATH[@]}"
    echo "miri ($model borrows): tests/api/rules.rs, ${#RULES[@]} tests"
    curated api rules:: "${RULES[@]}"
    echo "miri ($model borrows): tests/copy/copy_edges.rs, ${#COPY_EDGES[@]} tests"
    curated copy copy_edges:: "${COPY_EDGES[@]}"
    echo "miri ($model borrows): tests/copy/portable_copy.rs, ${#PORTABLE[@]} tests"
    curated copy portable_copy:: "${PORTABLE[@]}"
done
echo "miri: no report"
