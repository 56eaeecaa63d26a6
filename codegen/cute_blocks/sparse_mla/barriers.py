"""Named barrier ids of the split kernel (0 is the CTA barrier, sync_threads)."""

BAR_MMA = 1       # the MMA warps among themselves (epilogue), when a producer warpgroup runs apart
BAR_FULL = 2      # + stage: the producer filled the stage (arrive) -> MMA warps (sync)
BAR_EMPTY = 4     # + stage: the MMA warps are done with the stage (arrive) -> producer (sync)
# s_one_warpgroup hand-overs from warpgroup 0 (arrive) to warpgroup 1 (sync): a tile's new row
# maxima, published before warpgroup 0's exp2; the row sums, in the unstaged decode epilogue
BAR_TOTALS = 6
BAR_MAX = 7
