"""Building blocks of the lightning indexer and its top-k: fp8 scoring (fp8_mma), sortable keys
and the radix select (select), the wide-row select (wide_select)."""
