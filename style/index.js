import '@xyflow/react/dist/base.css';
import './base.css';
import './pipeline.css';
