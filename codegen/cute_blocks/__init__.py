"""CuTe DSL building blocks the generated kernel modules import (written once, as Python).

The generated modules import these files at build time, so their bytes are hashed into every
artifact key (codegen.identity.cute_blocks_hash). A block takes what it depends on as
arguments or constructor config, never as the importing module's globals."""
