"""doq's benchmark harnesses and one-off measurements, kept out of the installed `doq`
package (which keeps only `doq bench`, the user-facing load generator). Each module runs
from a checkout as `python bench/NAME.py ...` (it puts the checkout's `doq` and
`doq_client` first on the path) and imports its siblings as `bench.NAME`; bench/README.md
lists them. Tests never assert on their speed."""
