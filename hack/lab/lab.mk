# pathmend lab targets: a real 6.1 kernel in qemu (TCG) with nvmet, LIO,
# the NVMe-oF/TCP and iSCSI initiators and dm-multipath. Included by the
# top-level Makefile; see hack/lab/README.md. Needs root (debootstrap).

LAB_RUN  := hack/lab/run.sh
E2E_RUN  ?= .
FIXTURES ?=
SOAK_MINUTES ?= 5
SOAK_SEED    ?=

# The soak CI runs: a fixed schedule, so a red soak is a change in
# pathmend or in the kernel's timing, not a new draw.
CI_SOAK_MINUTES ?= 5
CI_SOAK_SEED    ?= 16

.PHONY: lab e2e e2e-under-load fixtures lab-image lab-shell lab-timings soak

lab: ## boot the lab guest, build real NVMe/iSCSI targets, show the topology and talk CSI to pathmend
	$(LAB_RUN) lab

e2e: ## run the e2e suite in the lab guest (one test: make e2e E2E_RUN=TestName)
	$(LAB_RUN) e2e '$(E2E_RUN)'

e2e-under-load: ## the e2e suite, CI's soak and the kubelet lab with two CPU burners on the host the whole time (LAB_BURNERS=2); each runs whatever the one before did
	hack/lab/underload.sh $(MAKE) -k e2e soak kubelet-lab E2E_RUN='$(E2E_RUN)' SOAK_MINUTES=$(CI_SOAK_MINUTES) SOAK_SEED=$(CI_SOAK_SEED)

soak: ## fault soak with verified I/O in the lab guest (SOAK_MINUTES=5 of faults; SOAK_SEED=N replays a run)
	$(LAB_RUN) soak '$(SOAK_MINUTES)' '$(SOAK_SEED)'

fixtures: ## recapture every sysfs fixture in testdata/fixtures from the lab (some: FIXTURES="nvme-healthy ...")
	$(LAB_RUN) fixtures $(FIXTURES)

lab-image: ## build (or reuse the cached) lab guest image and print its details
	$(LAB_RUN) image

lab-shell: ## interactive shell in the lab guest with the target helpers loaded
	$(LAB_RUN) shell

lab-timings: ## add the runs in hack/lab/out/timings.tsv to hack/lab/timings/runs.tsv and render hack/lab/README.md's measured table
	$(GO) run ./hack/lab/timings -add hack/lab/out/timings.tsv
