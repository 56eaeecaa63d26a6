"""Named barriers of the split kernel (id 0 is the CTA barrier, sync_threads).

The warpgroups of the two-role and producer forms are traced as separate code (one branch per
role), so the threads meeting at a named barrier execute different barrier instructions. PTX's
`bar.sync` / `bar.arrive` are the `.aligned` forms, which require every participating thread to
execute the same instruction: the hardware tolerates it, compute-sanitizer's synccheck reports it
("Divergent thread(s) in block") and stops the launch. `named_sync` and `named_arrive` are the
unaligned `barrier.sync` / `barrier.arrive`; they compile to the same BAR.SYNC / BAR.ARV
(docs/notes/sanitizers.md)."""
import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

BAR_MMA = 1       # the MMA warps among themselves (epilogue), when a producer warpgroup runs apart
BAR_FULL = 2      # + stage: the producer filled the stage (arrive) -> MMA warps (sync)
BAR_EMPTY = 4     # + stage: the MMA warps are done with the stage (arrive) -> producer (sync)
# s_one_warpgroup hand-overs from warpgroup 0 (arrive) to warpgroup 1 (sync): a tile's new row
# maxima, published before warpgroup 0's exp2; the row sums, in the unstaged decode epilogue
BAR_TOTALS = 6
BAR_MAX = 7


@dsl_user_op
def named_sync(barrier_id, number_of_threads, *, loc=None, ip=None):
    """barrier.sync id, n: wait until n threads (whole warps) have arrived at barrier id, from
    whichever instructions; orders shared memory as bar.sync does."""
    llvm.inline_asm(None, [Int32(barrier_id).ir_value(loc=loc, ip=ip), Int32(number_of_threads).ir_value(loc=loc, ip=ip)],
                    "barrier.sync $0, $1;", "r,r,~{memory}",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def named_arrive(barrier_id, number_of_threads):
    """barrier.arrive id, n without waiting (the producer's hand-over)."""
    cute.arch.barrier_arrive(barrier_id=barrier_id, number_of_threads=number_of_threads, aligned=False)
