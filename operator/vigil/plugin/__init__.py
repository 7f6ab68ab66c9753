"""`kubectl vigil`, the day-two tool (the console script `kubectl-vigil`, which kubectl finds on
PATH): why a job waits, the dead-letter queue, a paced redrive, pausing a queue, the queues at a
glance, an attempt's log (followed across retries with -f).

In the house's two parts: `report` decides what to show and what a redrive does, pure, on
objects as dicts and a time handed in; `render` turns its rows into what `-o` asks (a table,
wide, names, JSON, YAML, or kubectl's JSONPath and custom columns, by `jsonpath`, pure);
`args` is the command line alone (argparse, nothing else: a TAB reads it); `completion` decides
what a TAB offers, pure, from it, and answers kubectl's plugin completion
(`kubectl_complete-vigil`); `cli` is the thin part, reading and writing through
`vigil.kube.client.ApiClient` with the kubeconfig's credentials (`vigil.kube.config`), pacing its
writes and its polls on the one clock.
"""
