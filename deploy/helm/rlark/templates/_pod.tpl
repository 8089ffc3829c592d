{{/* The server pod, shared by the Deployment (one replica) and the StatefulSet (several).
The caller's context is the chart's root. */}}
{{- define "rlark.podTemplate" -}}
{{- $replicated := gt (int .Values.replicaCount) 1 }}
  template:
    metadata:
      labels:
        {{- include "rlark.selectorLabels" . | nindent 8 }}
      annotations:
        checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
        {{- with .Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "rlark.fullname" . }}
      automountServiceAccountToken: false
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        fsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      terminationGracePeriodSeconds: {{ add (.Values.config.shutdownGraceSeconds | default 30) 15 }}
      {{- if .Values.ca.existingSecret }}
      initContainers:
        - name: ca
          image: {{ .Values.ca.initImage }}
          # Only a data directory without a CA gets the supplied one: never overwrite.
          command:
            - sh
            - -c
            - |
              set -eu
              mkdir -p /var/lib/rlark/pki
              if [ ! -e /var/lib/rlark/pki/ca.crt ]; then
                cp /ca/ca.crt /ca/ca.key /var/lib/rlark/pki/
                chmod 0600 /var/lib/rlark/pki/ca.key /var/lib/rlark/pki/ca.crt
              fi
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]
          volumeMounts:
            - name: data
              mountPath: /var/lib/rlark
            - name: ca
              mountPath: /ca
              readOnly: true
      {{- end }}
      containers:
        - name: server
          image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args:
            - server
            - --config=/etc/rlark/server.yaml
            - --data-dir=/var/lib/rlark
            - --listen=0.0.0.0:8443
            {{- range (include "rlark.tlsSans" . | fromJsonArray) }}
            - --tls-san={{ . }}
            {{- end }}
            - --log-format={{ .Values.logFormat }}
            {{- if .Values.proxy.enabled }}
            - --proxy-listen=0.0.0.0:{{ .Values.proxy.port }}
            - --proxy-url=https://{{ .Values.proxy.host }}
            {{- end }}
            {{- if .Values.ca.sealingSecret.existingSecret }}
            - --ca-secret-file=/etc/rlark-ca-secret/{{ .Values.ca.sealingSecret.existingSecretKey }}
            {{- end }}
            {{- if $replicated }}
            # Each replica's own address for the others (streams to agents whose tunnel is on
            # another replica); agents reach them all at tunnel.advertiseURL.
            - --peer-url=https://$(POD_NAME).{{ include "rlark.peersService" . }}.{{ .Release.Namespace }}.svc:8443
            - --tls-san=$(POD_NAME).{{ include "rlark.peersService" . }}.{{ .Release.Namespace }}.svc
            {{- end }}
          {{- if or $replicated .Values.store.postgres.url .Values.store.postgres.existingSecret }}
          env:
            {{- if $replicated }}
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            {{- end }}
            {{- if or .Values.store.postgres.url .Values.store.postgres.existingSecret }}
            - name: RLARK_STORE
              valueFrom:
                secretKeyRef:
                  name: {{ include "rlark.postgresSecret" . }}
                  key: {{ .Values.store.postgres.existingSecretKey }}
            {{- end }}
          {{- end }}
          ports:
            - name: https
              containerPort: 8443
              protocol: TCP
            {{- if .Values.proxy.enabled }}
            - name: apps
              containerPort: {{ .Values.proxy.port }}
              protocol: TCP
            {{- end }}
          livenessProbe:
            httpGet:
              path: /livez
              port: https
              scheme: HTTPS
            periodSeconds: 10
            failureThreshold: 6
          readinessProbe:
            httpGet:
              path: /readyz
              port: https
              scheme: HTTPS
            periodSeconds: 5
          startupProbe:
            httpGet:
              path: /livez
              port: https
              scheme: HTTPS
            periodSeconds: 2
            failureThreshold: 150
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]
          resources:
            {{- toYaml .Values.resources | nindent 12 }}
          volumeMounts:
            - name: data
              mountPath: /var/lib/rlark
            - name: config
              mountPath: /etc/rlark
              readOnly: true
            - name: tmp
              mountPath: /tmp
            {{- if .Values.ca.sealingSecret.existingSecret }}
            - name: ca-secret
              mountPath: /etc/rlark-ca-secret
              readOnly: true
            {{- end }}
      volumes:
        {{- if not .Values.persistence.enabled }}
        - name: data
          emptyDir: {}
        {{- else if not $replicated }}
        - name: data
          persistentVolumeClaim:
            claimName: {{ .Values.persistence.existingClaim | default (printf "%s-data" (include "rlark.fullname" .)) }}
        {{- end }}
        {{- /* replicated with persistence: the StatefulSet's volumeClaimTemplates */}}
        - name: config
          configMap:
            name: {{ include "rlark.fullname" . }}
        - name: tmp
          emptyDir: {}
        {{- if .Values.ca.existingSecret }}
        - name: ca
          secret:
            secretName: {{ .Values.ca.existingSecret }}
            defaultMode: 256  # 0400
        {{- end }}
        {{- if .Values.ca.sealingSecret.existingSecret }}
        - name: ca-secret
          secret:
            secretName: {{ .Values.ca.sealingSecret.existingSecret }}
            defaultMode: 256  # 0400
        {{- end }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
