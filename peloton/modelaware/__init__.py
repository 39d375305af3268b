"""Model-aware plans: how many workers, in which roles, on which GPUs and hosts, chosen from the model and the cluster.

Pure (no I/O, no clock): the daemon's shells and the `peloton model` commands call it. The parts, each in the
module whose name says so:

- `profile`: measured step times of a few placements (the CSV `placement,local_bsz,step_time[,sync_time]`);
- `gpus`: the GPU models and links the cost model knows, with their relative throughput (an operator extends it);
- `document`: a model document (the model's description and, once fitted, the cost model's parameters);
- `cost`: the cost model, the step time of a placement (docs/model-aware.md writes its formulas out);
- `fit`: fitting the cost model's parameters to a profile;
- `plan`: the candidate plans on a cluster and the search for the best.
"""
