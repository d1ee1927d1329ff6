# The project's code and console scripts on top of the runtime image. One build, two tags' worth of
# defaults (service / workload) chosen by the ROLE build argument.
ARG RUNTIME
FROM ${RUNTIME}
COPY intellect/ /opt/intellect/
COPY bin/ /usr/local/bin/
ARG ROLE=workload
LABEL org.intellect.image=${ROLE}
# Tasks write under the bridge's /data: relative defaults (rollouts/, .checkpoints/) land there.
WORKDIR /data
ENV HOME=/data
CMD ["python3", "-m", "workloads.inference"]
